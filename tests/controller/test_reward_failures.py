"""A reward that keeps failing (issue 14 item 6: a custom reward that raises, returns NaN or a wrong
type, or hangs) on the real loop over the scripted engine and trainer. Each failed sample is in the
ledger with its reason (never a 0); a run whose groups fail to be scored ``max_engine_failures``
times in a row stops with ``ScoringFailed`` naming the verifier and the last reason instead of
admitting and filtering prompts forever without training; occasional failures do not stop it.
(The failure reasons themselves, one per kind of bad return: tests/reward/test_reward_service.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.controller.rundir import read_jsonl
from asyncrl.controller.scoring import ScoringFailed
from tests.controller.fakes import Script, ScriptedEngine, ScriptedTrainer
from tests.controller.test_loop_fake import PROMPTS, _cfg, _run

REASONS = {
    "raises": "error: RuntimeError: boom",
    "nan": "error: ValueError: m:f returned a non-finite reward nan",
    "wrong-type": "error: TypeError: m:f returned str, expected a number or bool",
    "hangs": "timeout",
}


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_a_reward_that_always_fails_stops_the_run(tmp_path: Path, kind: str) -> None:
    reason = REASONS[kind]
    scripts = {p.token_ids: Script(reward_failure=reason) for p in PROMPTS}
    cfg = _cfg(controller__max_engine_failures=4)
    with pytest.raises(RuntimeError) as info:
        _run(cfg, ScriptedEngine(scripts), ScriptedTrainer(), tmp_path, scripts)
    chain = [info.value, info.value.__cause__]
    failed = next(e for e in chain if isinstance(e, ScoringFailed))
    assert str(failed).startswith(
        f"4 groups in a row could not be scored (controller.max_engine_failures=4), the "
        f"last with {reason!r}: the verifier task.verifier=arithmetic fails"
    )
    ledger = read_jsonl(tmp_path / "trajectories.jsonl")
    filtered = [r for r in ledger if r["status"] == "filtered"]
    assert len(filtered) >= 4 * 2 and not [r for r in ledger if r["status"] == "trained"]
    assert all(r["reward_failure"] == reason and r["dropped"] == f"reward_failure: {reason}" for r in filtered)


def test_occasional_reward_failures_are_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    scripts = {p.token_ids: Script(reward_failure="error: RuntimeError: boom") for p in PROMPTS[::5]}
    state = _run(_cfg(controller__max_engine_failures=8), ScriptedEngine(scripts), ScriptedTrainer(), tmp_path, scripts)
    assert state.step == 6 and state.reward_failures > 0
    filtered = [r for r in read_jsonl(tmp_path / "trajectories.jsonl") if r["status"] == "filtered"]
    assert filtered and all(r["reward_failure"] == "error: RuntimeError: boom" for r in filtered)


def test_the_cli_prints_the_stop_without_a_traceback(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from asyncrl import cli
    from asyncrl.controller.scoring import scoring_failed

    stop = scoring_failed(8, "custom:m:f", "error: RuntimeError: boom")

    def cmd_train(args: object) -> int:
        raise RuntimeError("an episode failed") from stop  # how the loop raises it

    monkeypatch.setattr(cli.train, "run", cmd_train)
    assert cli.main(["train"]) == 1
    err = capsys.readouterr().err
    assert err == f"asyncrl: {stop}\n" and "task.verifier=custom:m:f fails" in err
