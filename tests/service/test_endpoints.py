"""The service's bookkeeping endpoints as the official client calls them: capabilities, heartbeats,
sampling sessions, training runs and checkpoints listed, the client's flags and telemetry."""

from __future__ import annotations

import httpx
import pytest

from tests.service.conftest import API_KEY, BASE

tinker = pytest.importorskip("tinker")
types = tinker.types


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/{path}", json=body, headers={"X-API-Key": API_KEY}, timeout=30)


def test_capabilities_runs_and_checkpoints_through_the_rest_client(service, client) -> None:
    rest = tinker.RestClient(base_url=service.url, api_key=API_KEY)
    models = rest.get_server_capabilities().result().supported_models
    described = [(m.model_name, m.trainable, m.sampleable, m.max_context_length) for m in models]
    assert described == [(BASE, True, True, 160)]
    tc = client.create_lora_training_client(base_model=BASE, rank=2, user_metadata={"recipe": "math"}).result()
    saved = tc.save_state("first").result().path
    sampler_path = tc.save_weights_for_sampler("first-sampler").result().path
    run = rest.get_training_run(tc.model_id).result()
    assert (run.training_run_id, run.base_model, run.is_lora, run.lora_rank) == (tc.model_id, BASE, True, 2)
    assert run.user_metadata == {"recipe": "math"}
    assert run.last_checkpoint.tinker_path == saved and run.last_sampler_checkpoint.tinker_path == sampler_path
    mine = [c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints if tc.model_id in c.tinker_path]
    assert mine == [saved, sampler_path]
    assert tc.model_id in [r.training_run_id for r in rest.list_training_runs().result().training_runs]


def test_sessions_heartbeats_sampling_sessions_and_the_clients_flags(service) -> None:
    url = service.url
    assert _post(url, "client/config", {"sdk_version": "0.38.0"}).json()["pjwt_auth_enabled"] is False
    assert _post(url, "client/dynamic_config", {"sdk_version": "0.38.0"}).json()["sample_cancel_enabled"] is False
    assert _post(url, "telemetry", {"events": []}).json() == {"status": "accepted"}
    session = _post(url, "create_session", {"tags": ["t"], "sdk_version": "0.38.0"}).json()["session_id"]
    assert _post(url, "session_heartbeat", {"session_id": session}).json() == {"type": "session_heartbeat"}
    sampler = _post(
        url, "create_sampling_session", {"session_id": session, "sampling_session_seq_id": 0, "base_model": BASE}
    ).json()["sampling_session_id"]
    assert _post(url, "join_sampling_session", {"sampling_session_id": sampler}).json()["client_counter"] == 1
    info = httpx.get(f"{url}/api/v1/samplers/{sampler}", headers={"X-API-Key": API_KEY}).json()
    assert info == {"sampler_id": sampler, "base_model": BASE, "model_path": None}
    assert _post(url, f"sessions/{session}/finish", {"reason": {"type": "success"}}).status_code == 200
    assert _post(url, "session_heartbeat", {"session_id": session}).status_code == 410  # the client stops its beat
    refused = _post(url, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": BASE})
    assert refused.status_code == 400 and "has finished" in refused.json()["detail"]
