"""The python tool's runner: the model's code in the sandbox, its output as the text the model sees."""

from __future__ import annotations

from asyncrl.reward.python_tool import MAX_CHARS, run_python


def test_output_comes_back() -> None:
    assert run_python("print(48213 * 379)") == "18272727"
    assert run_python("x = 1") == "(no output)"


def test_errors_and_timeouts_are_reported_with_the_traceback_tail() -> None:
    out = run_python("print('before')\n1/0")
    assert (
        out.startswith("before") and "[error: ZeroDivisionError" in out and "ZeroDivisionError" in out.splitlines()[-1]
    )
    assert "[timeout:" in run_python("while True: pass", timeout_s=1.0)


def test_long_output_is_cut_to_head_and_tail() -> None:
    out = run_python("for i in range(5000): print(i)")
    assert len(out) <= MAX_CHARS + 10 and out.startswith("0\n1\n") and out.endswith("4999") and "\n...\n" in out
