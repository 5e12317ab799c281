"""Math verifier: answer extraction, equivalence, timeouts in the main thread and in threads."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import asyncrl.reward.math as math_mod
from asyncrl.reward import VerifierTimeout
from asyncrl.reward.math import call_with_timeout, extract_answer, last_boxed, math_reward, reference_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("\\boxed{\\{1, \\{2\\}\\}}", "\\{1, \\{2\\}\\}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("complete \\boxed{7} then truncated \\boxed{8", "7"),
        ("\\fbox{3}", "3"),
        ("\\boxed 5 apples", "5"),
        ("work\n#### 1,234", "1,234"),
        ("The answer is 42.", "42"),
        ("Final Answer: $\\frac{3}{4}$. Done", "\\frac{3}{4}"),
        ("The answer is 3.5. Then more text 9", "3.5"),
        ("I got 3 apples and then 4 more, so 7 in all.", "7"),
        ("no numbers at all", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_last_number_fallback_can_be_disabled() -> None:
    assert extract_answer("so 7 in all", fallback_last_number=False) is None
    assert math_reward("so 7 in all", "7", fallback_last_number=False) == 0.0
    assert math_reward("so 7 in all", "7") == 1.0


def test_nested_braces() -> None:
    assert last_boxed("x \\boxed{a{b{c}}d} y") == "a{b{c}}d"


def test_reference_from_full_solution() -> None:
    assert reference_answer("Natalia sold 48/2 = 24 clips.\n#### 72") == "72"
    assert reference_answer("The result is $\\boxed{\\frac{1}{3}}$") == "\\frac{1}{3}"
    assert reference_answer(" 18 ") == "18"


@pytest.mark.parametrize(
    ("response", "gold", "reward"),
    [
        # thousands separators and plain numbers
        ("\\boxed{1,234}", "1234", 1.0),
        ("#### 1,234", "1,234", 1.0),
        ("\\boxed{1\\,000\\,000}", "1000000", 1.0),
        ("\\boxed{1{,}000}", "1000", 1.0),
        ("The answer is 1,235.", "1234", 0.0),
        # fractions and decimals
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{3}{4}}", "0.75", 1.0),
        ("#### 0.50", "1/2", 1.0),
        ("\\boxed{-\\frac{7}{2}}", "-3.5", 1.0),
        ("The answer is: 2.50", "2.5", 1.0),
        ("\\boxed{0.333}", "\\frac{1}{3}", 0.0),
        # percentages
        ("\\boxed{50\\%}", "50", 1.0),
        ("The answer is 50%.", "0.5", 1.0),
        ("The answer is 40%.", "50", 0.0),
        # units and currency
        ("The answer is 18 dollars.", "18", 1.0),
        ("\\boxed{\\$18.00}", "18", 1.0),
        ("So she pays $1,250.", "1250", 1.0),
        ("\\boxed{10\\text{ cm}}", "10", 1.0),
        ("\\boxed{30^\\circ}", "30", 1.0),
        # LaTeX expressions
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        ("\\boxed{x = 3}", "3", 1.0),
        ("\\boxed{2\\pi}", "\\pi", 0.0),
        # sets and intervals
        ("\\boxed{\\{1, 2\\}}", "\\{2,1\\}", 1.0),
        ("\\boxed{(1, 2]}", "(1,2]", 1.0),
        ("\\boxed{[1, 2]}", "(1,2]", 0.0),
        ("\\boxed{(-\\infty, 3)}", "(-\\infty,3)", 1.0),
        # signs and empties
        ("Answer: -5", "-5", 1.0),
        ("Answer: 5", "-5", 0.0),
        ("", "5", 0.0),
        ("\\boxed{}", "5", 0.0),
    ],
)
def test_equivalence(response: str, gold: str, reward: float) -> None:
    assert math_reward(response, gold) == reward


def test_overlong_answer_is_wrong_without_parsing() -> None:
    assert math_reward("\\boxed{" + "1+" * 2000 + "1}", "2001") == 0.0


def _slow_judge(*args: object) -> bool:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        pass
    return True


def test_timeout_in_main_thread_raises_and_restores_alarm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(math_mod, "_judge", _slow_judge)
    fired: list[int] = []

    def mine(signum: int, frame: object) -> None:
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, mine)
    before_set = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 60.0)
    after_set = time.monotonic()
    try:
        cpu = time.thread_time()
        with pytest.raises(VerifierTimeout):
            math_reward("\\boxed{1}", "1", timeout_s=0.3)
        # the judge spins 30 s; cut at 0.3 s of wall clock it used at most that much CPU (CPU time, not
        # wall: a loaded machine lengthens the wall clock, not this thread's CPU time)
        assert time.thread_time() - cpu < 2.0
        # our handler is back and the caller's pending timer survived, counting down from where it was
        # (60 s less the time since it was set: bounded by clock readings either side, whatever the load)
        before_get = time.monotonic()
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        after_get = time.monotonic()
        assert 60.0 - (after_get - before_set) - 5.0 < remaining <= 60.0 - (before_get - after_set) + 0.01
        assert signal.getsignal(signal.SIGALRM) is mine and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_timeout_in_a_thread_raises_without_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(math_mod, "_judge", lambda *a: time.sleep(5) or True)
    handler_before = signal.getsignal(signal.SIGALRM)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(math_reward, "\\boxed{1}", "1", timeout_s=0.3)
        with pytest.raises(VerifierTimeout):
            future.result(timeout=60)  # a hang guard: the judge returns True after 5 s
    assert signal.getsignal(signal.SIGALRM) is handler_before


def test_correct_results_from_many_threads() -> None:
    cases = [(f"The answer is {i:,}.", str(i), 1.0) for i in range(995, 1025)]
    cases += [(f"\\boxed{{{i + 1}}}", str(i), 0.0) for i in range(30)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda c: math_reward(c[0], c[1]), cases))
    assert got == [c[2] for c in cases]


def test_call_with_timeout_passes_values_and_errors() -> None:
    assert call_with_timeout(lambda: 3, 1.0) == 3
    assert call_with_timeout(lambda: 4, None) == 4
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 1.0)
    box: list[object] = []
    t = threading.Thread(target=lambda: box.append(call_with_timeout(lambda: 5, 1.0)))
    t.start()
    t.join()
    assert box == [5]
