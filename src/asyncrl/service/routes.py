"""The HTTP surface of the Tinker-compatible training service: the official client's REST paths.

Owns the route table (:func:`routes`) on the project's one HTTP stack (:class:`asyncrl.web.JsonServer`):
each handler reads its JSON body with :func:`asyncrl.web.schema.parse_body` (``/forward_backward``'s
protobuf body with :mod:`asyncrl.service.wire`), refuses what the service does not support with a 400
naming the fields (those :mod:`~asyncrl.service.schemas` marks ``Unsupported``), and calls
:class:`~asyncrl.service.core.TrainingService`. ``KeyError`` (an unknown session, model, sampler or future)
answers 404, ``ValueError`` 400. A path the table does not hold
answers 404 naming it (:func:`not_found`). The list of the client's paths and which of them are
supported is docs/tinker.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from asyncrl.service.core import TrainingService
from asyncrl.service.model import AdamStep, LoraSpec
from asyncrl.service.schemas import (
    CreateModelBody,
    CreateSamplingSessionBody,
    CreateSessionBody,
    FinishSessionBody,
    GetInfoBody,
    HeartbeatBody,
    JoinSamplingBody,
    LoadWeightsBody,
    OptimStepBody,
    RetrieveFutureBody,
    SampleBody,
    SaveForSamplerBody,
    SaveWeightsBody,
    unsupported,
)
from asyncrl.service.wire import decode_forward_backward
from asyncrl.web.checks import HTTPError
from asyncrl.web.schema import parse_body
from asyncrl.web.server import Request, Route

__all__ = ["CLIENT_CONFIG", "error_body", "not_found", "routes"]

PREFIX = "/api/v1"
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": False,
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}
"""The client's feature flags (``/client/config``): plain API keys, plain httpx, per-request futures,
custom losses computed by the client (``forward_backward_custom`` then needs only ``forward``)."""


def error_body(status: int, message: str, *_: Any) -> dict[str, Any]:
    return {"detail": message, "status": status}


def not_found(method: str, path: str) -> HTTPError:
    return HTTPError(404, f"{method} {path} is not supported by this Tinker-compatible service (docs/tinker.md)")


def _refuse(body: Any, where: str) -> None:
    """400 naming every field ``body`` sets to a value this service does not support (the fields marked
    ``schemas.Unsupported``)."""
    bad = unsupported(body)
    if bad:
        raise HTTPError(400, f"{where}: not supported by this service: {', '.join(bad)}")


def _future(request_id: str, model_id: str | None = None) -> dict[str, Any]:
    return {"request_id": request_id, "model_id": model_id}


def routes(svc: TrainingService) -> list[Route]:
    """The route table of one service."""
    table: dict[tuple[str, str], Callable[[Request], Awaitable[Any]]] = {
        ("POST", "/client/config"): _const(dict(CLIENT_CONFIG)),
        ("POST", "/client/dynamic_config"): _const({"refresh_interval_sec": 300, "sample_cancel_enabled": False}),
        ("POST", "/telemetry"): _const({"status": "accepted"}),
        ("GET", "/healthz"): _const({"status": "ok"}),
        ("GET", "/get_server_capabilities"): _capabilities(svc),
        ("POST", "/create_session"): _create_session(svc),
        ("POST", "/session_heartbeat"): _heartbeat(svc),
        ("POST", "/sessions/{session_id}/finish"): _finish(svc),
        ("POST", "/create_model"): _create_model(svc),
        ("POST", "/get_info"): _get_info(svc),
        ("POST", "/forward_backward"): _forward_backward(svc),
        ("POST", "/optim_step"): _optim_step(svc),
        ("POST", "/save_weights"): _save_weights(svc),
        ("POST", "/save_weights_for_sampler"): _save_for_sampler(svc),
        ("POST", "/load_weights"): _load_weights(svc),
        ("POST", "/create_sampling_session"): _create_sampler(svc),
        ("POST", "/join_sampling_session"): _join_sampler(svc),
        ("GET", "/samplers/{sampler_id}"): _get_sampler(svc),
        ("POST", "/asample"): _asample(svc),
        ("POST", "/retrieve_future"): _retrieve(svc),
        ("GET", "/training_runs"): _training_runs(svc),
        ("GET", "/training_runs/{run_id}"): _training_run(svc),
        ("GET", "/training_runs/{run_id}/checkpoints"): _run_checkpoints(svc),
        ("GET", "/checkpoints"): _all_checkpoints(svc),
    }
    return [Route(method, PREFIX + path, _guard(handler)) for (method, path), handler in table.items()]


def _guard(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
    """Unknown ids (``KeyError``, ``FileNotFoundError``) answer 404, an existing checkpoint name 400."""

    async def guarded(req: Request) -> Any:
        try:
            return await handler(req)
        except (KeyError, FileNotFoundError) as e:
            raise HTTPError(404, str(e.args[0] if isinstance(e, KeyError) and e.args else e)) from None
        except FileExistsError as e:
            raise HTTPError(400, str(e)) from None

    return guarded


def _const(payload: dict[str, Any]) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        return payload

    return handle


def _capabilities(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        models = [
            {
                "model_name": name,
                "max_context_length": svc.engines.spec.max_seq_len,
                "trainable": True,
                "sampleable": True,
            }
            for name in svc.served
        ]
        return {"supported_models": models}

    return handle


def _create_session(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(CreateSessionBody, req.json())
        _refuse(body, "create_session")
        return {"type": "create_session", "session_id": svc.create_session(body.tags, body.user_metadata)}

    return handle


def _heartbeat(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        if not svc.heartbeat(parse_body(HeartbeatBody, req.json()).session_id):
            raise HTTPError(410, "the session has finished")
        return {"type": "session_heartbeat"}

    return handle


def _finish(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(FinishSessionBody, req.json() or {})
        svc.finish(req.params["session_id"], body.reason)
        return None

    return handle


def _create_model(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(CreateModelBody, req.json())
        _refuse(body, "create_model")
        lora = None if body.lora_config is None else LoraSpec(**asdict(body.lora_config))
        request_id = svc.create_model(body.session_id, body.model_seq_id, body.base_model, lora, body.user_metadata)
        return _future(request_id)

    return handle


def _get_info(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        return svc.info(parse_body(GetInfoBody, req.json()).model_id)

    return handle


def _forward_backward(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        if req.headers.get("Content-Encoding", "identity") != "identity":
            raise HTTPError(
                415, f"forward_backward: Content-Encoding {req.headers['Content-Encoding']} is not supported"
            )
        if "protobuf" not in req.headers.get("Content-Type", ""):
            raise HTTPError(415, "forward_backward takes the client's protobuf body (application/x-protobuf)")
        fb = decode_forward_backward(req.body)
        return _future(svc.forward_backward(fb), fb.model_id)

    return handle


def _optim_step(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(OptimStepBody, req.json())
        _refuse(body, "optim_step")
        adam = AdamStep(**asdict(body.adam_params)) if body.adam_params is not None else AdamStep()
        return _future(svc.optim_step(body.model_id, body.seq_id, adam), body.model_id)

    return handle


def _save_weights(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(SaveWeightsBody, req.json())
        _refuse(body, "save_weights")
        meta = {str(k): str(v) for k, v in (body.user_metadata or {}).items()}
        request_id = svc.save_weights(body.model_id, body.seq_id, body.path, body.overwrite, meta)
        return _future(request_id, body.model_id)

    return handle


def _save_for_sampler(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(SaveForSamplerBody, req.json())
        _refuse(body, "save_weights_for_sampler")
        if body.path is None and body.sampling_session_seq_id is None:
            raise HTTPError(400, "save_weights_for_sampler needs a path (a name) or a sampling_session_seq_id")
        request_id = svc.save_for_sampler(
            body.model_id,
            body.seq_id,
            body.path,
            body.sampling_session_seq_id if body.path is None else None,
            body.user_metadata,
        )
        return _future(request_id, body.model_id)

    return handle


def _load_weights(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(LoadWeightsBody, req.json())
        _refuse(body, "load_weights")
        if body.model_id is not None:
            return _future(svc.load_weights(body.model_id, body.seq_id, body.path, body.optimizer), body.model_id)
        if body.session_id is None or body.model_seq_id is None:
            raise HTTPError(400, "load_weights needs model_id (+ seq_id) or session_id + model_seq_id")
        request_id = svc.create_from_checkpoint(
            body.session_id, body.model_seq_id, body.path, body.optimizer, body.user_metadata
        )
        return _future(request_id, f"{body.session_id}:train:{body.model_seq_id}")

    return handle


def _create_sampler(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(CreateSamplingSessionBody, req.json())
        sampler_id = svc.create_sampler(body.session_id, body.sampling_session_seq_id, body.base_model, body.model_path)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    return handle


def _join_sampler(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    counters: dict[str, int] = {}

    async def handle(req: Request) -> Any:
        sampler_id = parse_body(JoinSamplingBody, req.json()).sampling_session_id
        svc.sampler(sampler_id)
        counters[sampler_id] = counters.get(sampler_id, 0) + 1
        return {"type": "join_sampling_session", "client_counter": counters[sampler_id]}

    return handle


def _get_sampler(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        return svc.sampler_info(req.params["sampler_id"])

    return handle


def _asample(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        body = parse_body(SampleBody, req.json())
        _refuse(body, "asample")
        prompt: list[int] = []
        for chunk in body.prompt.chunks:
            tokens = chunk.get("tokens")
            if chunk.get("type", "encoded_text") != "encoded_text" or not isinstance(tokens, list):
                raise HTTPError(
                    400, f"asample: prompt chunks of type {chunk.get('type')!r} are not supported (text only)"
                )
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                raise HTTPError(400, "asample: prompt tokens must be integers")
            prompt.extend(tokens)
        if body.sampling_session_id is not None:
            target = svc.sampler(body.sampling_session_id)
        else:
            target = svc.target(body.base_model, body.model_path)
        if not prompt:
            raise HTTPError(400, "asample: the prompt is empty")
        request_id, sequence_ids = svc.sample(
            target,
            prompt,
            asdict(body.sampling_params),
            body.num_samples,
            prompt_logprobs=bool(body.prompt_logprobs),
            last_n=body.prompt_logprobs_last_n,
        )
        return {"request_id": request_id, "sample_sequence_ids": sequence_ids}

    return handle


def _retrieve(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        request_id = parse_body(RetrieveFutureBody, req.json()).request_id
        try:
            state, result = await svc.futures.retrieve(request_id)
        except KeyError:
            raise HTTPError(404, f"no future {request_id!r} (futures do not outlive a restart)") from None
        if state == "pending":
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        if state == "failed":
            return {"error": result[0], "category": result[1]}
        return result

    return handle


def _training_runs(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        runs = [svc.training_run(run_id) for run_id in svc.store.run_ids()]
        return {"training_runs": runs, "cursor": {"offset": 0, "limit": len(runs), "total_count": len(runs)}}

    return handle


def _training_run(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        return svc.training_run(req.params["run_id"])

    return handle


def _run_checkpoints(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        svc.store.read_run(req.params["run_id"])
        return {"checkpoints": svc.store.checkpoints(req.params["run_id"])}

    return handle


def _all_checkpoints(svc: TrainingService) -> Callable[[Request], Awaitable[Any]]:
    async def handle(req: Request) -> Any:
        checkpoints = [c for run_id in svc.store.run_ids() for c in svc.store.checkpoints(run_id)]
        return {
            "checkpoints": checkpoints,
            "cursor": {"offset": 0, "limit": len(checkpoints), "total_count": len(checkpoints)},
        }

    return handle
