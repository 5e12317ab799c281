"""The runner behind the ``python`` tool of multi-turn episodes: the model's code in the sandbox.

``run_python(code)`` runs a program through the code sandbox (``code.run_code_tests`` with no tests:
namespaces, rlimits, a wall-clock limit, every process killed afterwards) and turns the outcome
into the text the model sees: what it printed, then, when it did not finish cleanly, the verdict
and the last lines of its error output. Blocking; the ``python`` environment calls it in a thread.
"""

from __future__ import annotations

from asyncrl.reward.code import SandboxLimits, run_code_tests

__all__ = ["run_python"]

MAX_CHARS = 2000
"""Longest text returned to the model (past it, the first and last halves are kept)."""


def run_python(code: str, *, timeout_s: float = 5.0, limits: SandboxLimits | None = None, isolate: bool = True) -> str:
    """Run ``code`` in the sandbox; the text the model sees (see the module docstring)."""
    result = run_code_tests(code, "", timeout_s=timeout_s, limits=limits, isolate=isolate)
    out = result.stdout
    if result.status != "passed":
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        out += f"\n[{result.status}: {result.detail}]" + (f"\n{tail}" if tail else "")
    out = out.strip() or "(no output)"
    if len(out) > MAX_CHARS:
        out = out[: MAX_CHARS // 2] + "\n...\n" + out[-MAX_CHARS // 2 :]
    return out
