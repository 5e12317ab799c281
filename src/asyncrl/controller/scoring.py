"""The ``score`` callable handed to workflows: decode a completion, run the configured verifier.

The synthetic ``arithmetic`` verifier is a regular expression and runs inline; every other
verifier goes through the ``RewardService`` (process pool, timeouts, cache). A verification that
could not run returns a failure reason, never a silent 0.
"""

from __future__ import annotations

from typing import Any

from asyncrl.reward.arithmetic import arithmetic_reward
from asyncrl.rollout.workflow import ScoreFn
from asyncrl.types import Completion, Prompt


def make_score_fn(verifier: str, tokenizer: Any, service: Any | None = None) -> ScoreFn:
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
