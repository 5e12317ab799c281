"""A training run survives a restart of the service: its checkpoint is listed and a new client resumes
from it (weights and optimizer state) through the official ``tinker`` client."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.service.conftest import API_KEY, BASE, start_service

tinker = pytest.importorskip("tinker")
types = tinker.types

TOKENS = [5, 17, 23, 42, 8, 19, 33, 12]


def _datum():
    return types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0] * (len(TOKENS) - 1)},
    )


def _logprobs(tc) -> np.ndarray:
    return tc.forward([_datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def _step(tc) -> None:
    tc.forward_backward([_datum()], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()


def test_restart_and_resume_from_the_services_checkpoint(tiny_policy_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    with start_service(tiny_policy_dir, root) as srv:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=API_KEY)
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=0).result()
        _step(tc)
        _step(tc)
        path = tc.save_state("after-2").result().path
        before = _logprobs(tc)
        _step(tc)  # the step the resumed run must repeat exactly
        expected = _logprobs(tc)
        run_id = tc.model_id
        sc.close("interrupted").result()
    assert path == f"tinker://{run_id}/weights/after-2"

    with start_service(tiny_policy_dir, root) as srv:  # a new process would see the same files
        rest = tinker.RestClient(base_url=srv.url, api_key=API_KEY)
        listed = rest.list_checkpoints(run_id).result().checkpoints
        assert [c.tinker_path for c in listed] == [path] and listed[0].checkpoint_type == "training"
        runs = rest.list_training_runs().result().training_runs
        assert [r.training_run_id for r in runs] == [run_id] and runs[0].is_lora and runs[0].lora_rank == 4
        sc = tinker.ServiceClient(base_url=srv.url, api_key=API_KEY)
        resumed = sc.create_training_client_from_state_with_optimizer(path).result()
        np.testing.assert_allclose(_logprobs(resumed), before, atol=1e-6)
        _step(resumed)  # Adam's moments came back too: the same step as before the restart
        np.testing.assert_allclose(_logprobs(resumed), expected, atol=1e-5)
        weights_only = sc.create_training_client_from_state(path).result()
        np.testing.assert_allclose(_logprobs(weights_only), before, atol=1e-6)
        sc.close("success").result()


def _call(url: str, path: str, body: dict) -> dict:
    import httpx

    answer = httpx.post(f"{url}/api/v1/{path}", json=body, headers={"X-API-Key": API_KEY}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _result(url: str, future: dict) -> dict:
    while True:
        out = _call(url, "retrieve_future", {"request_id": future["request_id"]})
        if out.get("type") != "try_again":
            return out


def test_full_fine_tuning_where_the_request_has_no_lora_config(tiny_policy_dir: Path, tmp_path: Path) -> None:
    """The client's LoRA helpers always send a rank; a bare ``create_model`` trains every weight."""
    with start_service(tiny_policy_dir, tmp_path / "root") as srv:
        session = _call(srv.url, "create_session", {"tags": [], "sdk_version": "raw"})["session_id"]
        made = _result(
            srv.url, _call(srv.url, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": BASE})
        )
        saved = _result(srv.url, _call(srv.url, "save_weights", {"model_id": made["model_id"], "path": "init"}))
        sc = tinker.ServiceClient(base_url=srv.url, api_key=API_KEY)
        tc = sc.create_training_client_from_state_with_optimizer(saved["path"]).result()
        info = tc.get_info()
        assert info.is_lora is False and info.lora_rank is None
        first = tc.forward([_datum()], "cross_entropy").result().metrics["loss:sum"]
        _step(tc)
        assert tc.forward([_datum()], "cross_entropy").result().metrics["loss:sum"] < first
        sc.close("success").result()
