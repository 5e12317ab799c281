"""What a finished episode means for the run (``EpisodeOutcomes``): trained or filtered, and failures in a row.

The controller's loop (``controller.loop``) moves each group and wakes whoever waits; this module
judges the episode and keeps the two streaks that stop a run rather than let it go on without training:

- **the filter**: a group with a sample whose reward could not be computed is filtered
  (``reward_failure: <reason>``), and so is one whose rewards are all equal when
  ``algo.filter_equal_rewards`` is on (``equal_rewards``);
- **engine failures in a row**: episodes that failed after their retries; at
  ``controller.max_engine_failures`` the run stops (a generated group ends the streak);
- **scoring failures in a row**: groups filtered for a reward failure; at
  ``controller.max_engine_failures`` the verifier is broken, not the policy, and the run stops with
  ``ScoringFailed`` (``controller.scoring``); any other group ends the streak.

It decides and wakes no one: a streak at its limit hands the error that ends the run to ``stop``
(``Controller._fail``).
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.controller.scoring import scoring_failed
from asyncrl.types import Group


def describe(error: BaseException | None) -> str:
    """What failed, for the ledger and the error that stops the run: ``Type: message`` (``unknown``: no error)."""
    return f"{type(error).__name__}: {error}" if error is not None else "unknown"


class EpisodeOutcomes:
    """The filter and the failure streaks of one ``Controller`` (see the module docstring)."""

    def __init__(
        self, max_failures: int, filter_equal_rewards: bool, verifier: str, stop: Callable[[BaseException], None]
    ) -> None:
        """``max_failures``: ``controller.max_engine_failures``; ``filter_equal_rewards``:
        ``algo.filter_equal_rewards``; ``verifier``: the reward's name, for the message when scoring
        keeps failing (``task.verifier``); ``stop``: called with the error that ends the run."""
        self.max_failures = max_failures
        self.filter_equal_rewards = filter_equal_rewards
        self.verifier = verifier
        self._stop = stop
        self.consecutive_failures = 0  # episodes in a row that failed after their retries
        self.scoring_failures = 0  # groups in a row filtered for a reward failure

    def engine_failed(self, error: BaseException | None) -> None:
        """An episode failed after its retries with ``error`` (already in the ledger): at ``max_failures``
        in a row, stop the run."""
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.max_failures:
            failure = RuntimeError(
                f"{self.consecutive_failures} consecutive episodes failed after retries: {describe(error)}"
            )
            failure.__cause__ = error
            self._stop(failure)

    def judge(self, group: Group) -> str | None:
        """A generated group (the engine's failure streak ends): why it is filtered (``reward_failure:
        <reason>``, ``equal_rewards``), or None: it is trained. Counts the groups in a row filtered
        because their rewards could not be computed; at ``max_failures`` the verifier is broken, not the
        policy: stop with ``ScoringFailed`` rather than admit and filter prompts forever without training."""
        self.consecutive_failures = 0
        reason = self.filter_reason(group)
        if reason is None or not reason.startswith("reward_failure: "):
            self.scoring_failures = 0
            return reason
        self.scoring_failures += 1
        if self.scoring_failures == self.max_failures:
            last = reason.removeprefix("reward_failure: ")
            self._stop(scoring_failed(self.scoring_failures, self.verifier, last))
        return reason

    def filter_reason(self, group: Group) -> str | None:
        """Why ``group`` is filtered (``reward_failure: <reason>``, ``equal_rewards``), or None: it is trained."""
        failures = [f for f in group.reward_failures if f is not None]
        if failures:
            return f"reward_failure: {failures[0]}"
        if self.filter_equal_rewards and len(set(group.rewards)) == 1:
            return "equal_rewards"
        return None
