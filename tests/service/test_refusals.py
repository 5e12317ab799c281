"""What the service does not support is refused with a 4xx that names it; a wrong API key is refused;
the protobuf messages agree with the client's own schema."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from asyncrl.service import wire
from tests.service.conftest import API_KEY, BASE

tinker = pytest.importorskip("tinker")
types = tinker.types


@pytest.fixture(scope="module")
def training(client):
    return client.create_lora_training_client(base_model=BASE, rank=2).result()


def _datum(**inputs):
    return types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5]), loss_fn_inputs=inputs)


def test_an_unsupported_loss_is_refused_naming_it(client) -> None:
    tc = client.create_lora_training_client(base_model=BASE, rank=2).result()  # a refusal poisons its client
    data = [_datum(target_tokens=[4, 5, 6], logprobs=[0.0] * 3, advantages=[1.0] * 3)]
    with pytest.raises(tinker.BadRequestError, match="'dro' is not supported"):
        tc.forward_backward(data, "dro").result()
    tc = client.create_lora_training_client(base_model=BASE, rank=2).result()
    masked = [_datum(target_tokens=[4, 5, 6], logprobs=[0.0] * 3, advantages=[1.0] * 3, mask=np.ones(3, np.float32))]
    with pytest.raises(tinker.BadRequestError, match=r"loss_fn_inputs \['mask'\] are not used by 'ppo'"):
        tc.forward_backward(masked, "ppo").result()


def test_unsupported_sampling_fields_are_refused_naming_them(training) -> None:
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints([3, 4, 5])
    with pytest.raises(tinker.BadRequestError, match="topk_prompt_logprobs"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2), topk_prompt_logprobs=2).result()
    with pytest.raises(tinker.BadRequestError, match="topk_sample_logprobs"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2), topk_sample_logprobs=3).result()
    many = sampler.sample(prompt, 10, types.SamplingParams(max_tokens=2, seed=1)).result().sequences
    assert len(many) == 10  # more than the engine's 8 slots: two rounds


def test_an_unknown_endpoint_and_an_unknown_base_model_are_refused(service, client) -> None:
    headers = {"X-API-Key": API_KEY}
    answer = httpx.post(f"{service.url}/api/v1/create_custom_loss", json={}, headers=headers)
    assert answer.status_code == 404 and "/api/v1/create_custom_loss is not supported" in answer.json()["detail"]
    answer = httpx.post(f"{service.url}/api/v1/get_info", json={"model_id": "m", "colour": "red"}, headers=headers)
    assert answer.status_code == 400 and "colour" in answer.json()["detail"]
    with pytest.raises(tinker.BadRequestError, match="not served here"):
        client.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=2).result()


def test_a_wrong_api_key_is_refused(service) -> None:
    assert httpx.get(f"{service.url}/api/v1/healthz", headers={"X-API-Key": API_KEY}).status_code == 200
    assert httpx.get(f"{service.url}/api/v1/healthz", headers={"X-API-Key": "tml-wrong"}).status_code == 401
    assert httpx.get(f"{service.url}/api/v1/healthz").status_code == 401
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=service.url, api_key="tml-wrong").get_server_capabilities()


def test_the_protobuf_messages_match_the_clients_schema() -> None:
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

    datum = _datum(target_tokens=types.TensorData(data=[4, 5, 6], dtype="int64", shape=[3]), weights=[0.0, 1.0, 0.5])
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[datum, datum], loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.7}
        ),
        model_id="m:train:0",
        seq_id=3,
    )
    decoded = wire.decode_forward_backward(forward_backward_request_to_proto(request).SerializeToString())
    assert (decoded.model_id, decoded.seq_id, decoded.loss_fn) == ("m:train:0", 3, "ppo")
    assert decoded.loss_fn_config == {"clip_low_threshold": 0.7} and len(decoded.data) == 2
    assert decoded.data[1].tokens == [3, 4, 5] and decoded.data[1].inputs["target_tokens"].tolist() == [4, 5, 6]
    np.testing.assert_array_equal(decoded.data[0].inputs["weights"], np.array([0.0, 1.0, 0.5], dtype=np.float32))

    outputs = [{"logprobs": np.array([-1.0, -2.5])}, {"logprobs": np.array([-0.25])}]
    fb = deserialize_forward_backward_output(wire.encode_forward_backward_output(outputs, {"loss:sum": 3.5}))
    assert fb.metrics == {"loss:sum": 3.5}
    assert [o["logprobs"].tolist() for o in fb.loss_fn_outputs] == [[-1.0, -2.5], [-0.25]]
    sampled = [wire.SampledSequence([7, 8], [-0.5, -1.5], "length"), wire.SampledSequence([9], [-2.0], "stop")]
    response = deserialize_sample_response(wire.encode_sample_response(sampled))
    assert [(list(s.tokens), list(s.logprobs), s.stop_reason) for s in response.sequences] == [
        ([7, 8], [-0.5, -1.5], "length"),
        ([9], [-2.0], "stop"),
    ]
