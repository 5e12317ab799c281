"""The ``score`` callable handed to workflows: decode a completion, run the configured verifier.

The synthetic ``arithmetic`` verifier is a regular expression and runs inline; every other
verifier goes through the ``RewardService`` (process pool, timeouts, cache). A verification that
could not run returns a failure reason, never a silent 0: its group is filtered and the ledger
records the reason of each sample. ``ScoringFailed`` is what stops a run whose groups keep failing
to be scored (a custom reward that raises, returns NaN or a wrong type, or hangs, every time), so that
it does not go on admitting prompts and filtering them without ever training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncrl.reward.arithmetic import arithmetic_reward
from asyncrl.rollout.workflow import ScoreFn
from asyncrl.types import Completion, Prompt

if TYPE_CHECKING:
    from asyncrl.reward.service import RewardScorer


class ScoringFailed(RuntimeError):
    """Groups in a row whose rewards could not be computed: the verifier is broken, not the policy."""


def scoring_failed(groups: int, verifier: str, last: str) -> ScoringFailed:
    """The error for ``groups`` groups in a row filtered for a reward failure (``last``: the latest reason)."""
    return ScoringFailed(
        f"{groups} groups in a row could not be scored (controller.max_engine_failures={groups}), the last "
        f"with {last!r}: the verifier task.verifier={verifier} fails, not the policy. Every failure is in "
        "the ledger (status filtered, reward_failure); fix the verifier, then resume the run "
        "(asyncrl train --resume RUN_DIR)."
    )


def make_score_fn(verifier: str, tokenizer: Any, service: RewardScorer | None = None) -> ScoreFn:
    """Build ``score(prompt, completion) -> (reward, failure)`` for ``verifier``."""

    async def score_inline(prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
        text = tokenizer.decode(list(completion.output_ids), skip_special_tokens=True)
        return arithmetic_reward(text, prompt.answer), None

    async def score_service(prompt: Prompt, completion: Completion) -> tuple[float, str | None]:
        text = tokenizer.decode(list(completion.output_ids), skip_special_tokens=True)
        result = await service.score(
            verifier, text, prompt.answer, prompt=str(prompt.meta.get("question", "")), row=dict(prompt.meta)
        )
        return result.reward, result.failure

    if verifier == "arithmetic" and service is None:
        return score_inline
    if service is None:
        raise ValueError(f"verifier {verifier!r} needs a RewardService")
    return score_service
