"""``trainer.sft``: examples are (ids, loss mask); a single-turn one learns its response only; a mask
that does not fit its ids, or learns nothing, is refused; the loss is the masked tokens' mean NLL."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config import SFTConfig
from asyncrl.models import load_policy
from asyncrl.trainer.sft import prompt_response_example, sft_train


def test_prompt_response_example() -> None:
    assert prompt_response_example((1, 2), (3, 4, 5)) == ((1, 2, 3, 4, 5), (0, 0, 1, 1, 1))


@pytest.mark.parametrize("bad", [((1, 2, 3), (0, 1)), ((1, 2, 3), (0, 0, 0))])
def test_a_bad_mask_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="loss mask"):
        sft_train(None, [bad], SFTConfig(steps=1), progress=False)


def test_the_loss_is_the_masked_tokens_mean_nll(tiny_policy_dir) -> None:
    """One step on one example whose mask covers its last 3 tokens: the loss reported (computed before
    the update) is their mean negative log-likelihood under the initial model, not the whole sequence's."""
    model, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    ids = tuple(tokenizer.encode("Q:12*3\nA:#36", add_special_tokens=False))
    mask = (0,) * (len(ids) - 3) + (1, 1, 1)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
        nll = -logp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    masked, whole = float(nll[-3:].mean()), float(nll.mean())
    stats = sft_train(model, [(ids, mask)], SFTConfig(steps=1, batch_size=1, warmup_steps=1), progress=False)
    assert stats["sft_tokens"] == len(ids)
    assert stats["sft_loss"] == pytest.approx(masked, rel=1e-4) and abs(masked - whole) > 1e-3


def test_abandon_above_stops_at_its_step_only_when_the_loss_is_above(tiny_policy_dir) -> None:
    """``abandon_above=(step, loss)``: a loss above the bar at that step stops the stage there (its stats say
    where); a bar above the loss lets it run to the end, with no ``sft_abandoned_at``."""
    model, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    ids = tuple(tokenizer.encode("Q:12*3\nA:#36", add_special_tokens=False))
    example = (ids, (0,) * (len(ids) - 3) + (1, 1, 1))
    cfg = SFTConfig(steps=4, batch_size=1, warmup_steps=1)
    stopped = sft_train(model, [example], cfg, progress=False, abandon_above=(2, 1e-6))
    assert stopped["sft_abandoned_at"] == 2 and stopped["sft_tokens"] == 2 * len(ids)
    finished = sft_train(model, [example], cfg, progress=False, abandon_above=(2, 1e6))
    assert "sft_abandoned_at" not in finished and finished["sft_tokens"] == 4 * len(ids)


def test_stop_below_ends_the_stage_once_the_loss_falls_below_it(tiny_policy_dir) -> None:
    """``stop_below``: the first step (after the warm-up) whose smoothed loss is below the bar ends the stage, done
    (``sft_stopped_at``, no ``sft_abandoned_at``); a bar below every loss lets it run its steps."""
    model, tokenizer = load_policy(tiny_policy_dir, device="cpu", dtype="float32")
    ids = tuple(tokenizer.encode("Q:12*3\nA:#36", add_special_tokens=False))
    example = (ids, (0,) * (len(ids) - 3) + (1, 1, 1))
    cfg = SFTConfig(steps=6, batch_size=1, warmup_steps=3)
    early = sft_train(model, [example], cfg, progress=False, stop_below=1e6)  # below from the first step
    assert early["sft_stopped_at"] == 3 and early["sft_tokens"] == 3 * len(ids)  # not before the warm-up's end
    assert "sft_abandoned_at" not in early
    whole = sft_train(model, [example], cfg, progress=False, stop_below=1e-9)
    assert "sft_stopped_at" not in whole and whole["sft_tokens"] == 6 * len(ids)
