"""Math final-answer verification: extract the final answer, judge equivalence with math-verify.

Owns :func:`extract_answer` (``\\boxed{...}`` with nested braces, GSM8K's ``#### n``, "the answer
is ...", and optionally the last number), :func:`is_equivalent` (a cheap exact check for plain
numbers, then math-verify: fractions, decimals, percentages, units, thousands separators, LaTeX,
sets and intervals) and :func:`math_reward` (1.0 or 0.0, with a timeout).

Timeouts never use ``signal.alarm`` outside the main thread (the trap behind verifiers that return
0 in threads): math-verify's own signal-based timeouts are switched off; in the main thread we use
an interval timer and restore any previous one, elsewhere the check runs in a helper thread that
is abandoned on timeout. A timeout raises :class:`~asyncrl.reward.VerifierTimeout`; it is never
reported as a wrong answer. The :class:`~asyncrl.reward.service.RewardService` adds a hard kill.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from asyncrl.reward import VerifierTimeout

T = TypeVar("T")

MAX_ANSWER_CHARS = 2000
"""Extracted answers longer than this are judged wrong without calling math-verify."""

_BOXED = re.compile(r"\\(?:boxed|fbox)\b")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
_PHRASE = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is|was|will\s+be|would\s+be|equals)?\s*(?:[:=]|\s)\s*([^\n]+)",
    re.I,
)
_NUMBER = re.compile(
    r"(?<![\w.])[-+−]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?:\s*(?:\\?%|percent\b))?",
    re.I,
)
_PLAIN_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d,])")
_NUMBER_WITH_WORDS = re.compile(r"([-+]?\d+(?:\.\d+)?(?:/\d+)?)\s*(\\?%|percent)?\s*(?:[A-Za-z][A-Za-z.]*\s*)+", re.I)


def _matching_brace(text: str, open_at: int) -> int | None:
    depth = 0
    for i in range(open_at, len(text)):
        c = text[i]
        if c == "\\":
            continue
        if c == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif c == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces allowed;
    also ``\\boxed 5``)."""
    for m in reversed(list(_BOXED.finditer(text))):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            end = _matching_brace(text, i)
            if end is not None:
                return text[i + 1 : end]
        elif i > m.end():
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                return token.group(0)
    return None


def _clip_sentence(candidate: str) -> str:
    """Cut "42. Then ..." after the first sentence; keep inline math ``$...$`` whole."""
    s = candidate.strip()
    for opener, closer in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(opener):
            end = s.find(closer, len(opener))
            if end > 0:
                return s[len(opener) : end]
    m = re.search(r"\.(?:\s|$)", s)
    return s[: m.start()] if m else s


def extract_answer(text: str, *, fallback_last_number: bool = True) -> str | None:
    """The final answer in a response, by priority: the last ``\\boxed{}``, the last ``#### n``,
    the last "answer is ..." phrase, then (if enabled) the last number. None if nothing found."""
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    marks = _GSM8K.findall(text)
    if marks and marks[-1].strip():
        return marks[-1].strip()
    phrases = _PHRASE.findall(text)
    if phrases:
        clipped = _clip_sentence(phrases[-1])
        if clipped.strip():
            return clipped.strip()
    if fallback_last_number:
        numbers = _NUMBER.findall(text)
        if numbers:
            return numbers[-1].strip()
    return None


def reference_answer(answer: str) -> str:
    """The gold answer as given, or its final part when a full solution was passed
    (``#### n`` or ``\\boxed{}``)."""
    marks = _GSM8K.findall(answer)
    if marks and marks[-1].strip():
        return marks[-1].strip()
    boxed = last_boxed(answer)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    return answer.strip()


def normalize(answer: str) -> str:
    """Light, meaning-preserving clean-up before math-verify: math delimiters, currency signs,
    LaTeX thin spaces and ``{,}`` inside numbers, thousands separators, trailing punctuation and
    words after a number ("18 dollars")."""
    s = answer.strip().replace("−", "-")
    for opener, closer in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(opener) and s.endswith(closer) and len(s) >= len(opener) + len(closer):
            s = s[len(opener) : len(s) - len(closer)].strip()
    s = re.sub(r"^\\?\$\s*", "", s)
    s = re.sub(r"(?<=[\s(=])\\?\$(?=\s*\d)", "", s)
    s = re.sub(r"(?<=\d)(?:\\,|\\!|\\ |\{,\})(?=\d{3})", lambda m: "," if m.group(0) == "{,}" else "", s)
    s = s.rstrip(" .;:,!")
    if not s.startswith(("(", "[", "\\{", "{", "\\left")):
        s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    m = _NUMBER_WITH_WORDS.fullmatch(s)
    if m and "\\" not in s:
        s = m.group(1) + ("\\%" if m.group(2) else "")
    s = re.sub(r"(?<=\d)\s*%", "\\%", s)
    s = re.sub(r"(?<!\\)%", "\\%", s)
    return s


_mv: Any = None


def _math_verify() -> Any:
    """Import math-verify once; switch off its signal-based timeouts (we time out ourselves)."""
    global _mv
    if _mv is None:
        import math_verify
        import math_verify.grader
        import math_verify.parser

        # Its timeouts use signal.alarm, unusable off the main thread; we pass None and silence
        # the one-time warning about it, since math_reward enforces its own timeout.
        math_verify.grader.TIMEOUT_WARNING_SHOWN = True
        math_verify.parser.TIMEOUT_WARNING_SHOWN = True
        config = [
            math_verify.LatexExtractionConfig(boxed_match_priority=0),
            math_verify.ExprExtractionConfig(),
        ]
        _mv = (math_verify, config)
    return _mv


def _parse(expr: str) -> list[Any]:
    mv, config = _math_verify()
    return mv.parse(f"$\\boxed{{{expr}}}$", extraction_config=config, parsing_timeout=None)


def is_equivalent(candidate: str, gold: str) -> bool:
    """Whether two final answers are mathematically equivalent (no timeout: see math_reward)."""
    cand, ref = normalize(candidate), normalize(gold)
    if not cand or not ref:
        return False
    if _PLAIN_NUMBER.fullmatch(cand) and _PLAIN_NUMBER.fullmatch(ref):
        try:
            if Decimal(cand) == Decimal(ref):
                return True
        except InvalidOperation:
            pass
    mv, _ = _math_verify()
    gold_parsed, cand_parsed = _parse(ref), _parse(cand)
    if not gold_parsed or not cand_parsed:
        return False
    return bool(mv.verify(gold_parsed, cand_parsed, timeout_seconds=None))


def _judge(response: str, answer: str, fallback_last_number: bool) -> bool:
    candidate = extract_answer(response, fallback_last_number=fallback_last_number)
    if candidate is None or len(candidate) > MAX_ANSWER_CHARS:
        return False
    return is_equivalent(candidate, reference_answer(answer))


def math_reward(
    response: str, answer: str, *, timeout_s: float | None = 5.0, fallback_last_number: bool = True
) -> float:
    """1.0 if the response's final answer is equivalent to ``answer``, else 0.0.

    Raises :class:`~asyncrl.reward.VerifierTimeout` when the check takes longer than
    ``timeout_s`` (None: no timeout). Safe to call from any thread and from worker processes.
    """
    ok = call_with_timeout(lambda: _judge(response, answer, fallback_last_number), timeout_s)
    return 1.0 if ok else 0.0


class _Alarm(BaseException):
    """Raised by our SIGALRM handler; a BaseException so ``except Exception`` cannot eat it."""


def call_with_timeout(fn: Callable[[], T], timeout_s: float | None) -> T:
    """Run ``fn`` with a timeout without ``signal.alarm`` off the main thread.

    Main thread: an ``ITIMER_REAL`` timer whose handler raises inside ``fn``; the previous
    handler and timer are restored. Other threads: ``fn`` runs in a daemon helper thread; on
    timeout the helper is abandoned (it cannot be killed) and VerifierTimeout is raised.
    """
    if timeout_s is None or timeout_s <= 0:
        return fn()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _call_with_alarm(fn, timeout_s)
    return _call_in_thread(fn, timeout_s)


def _call_with_alarm(fn: Callable[[], T], timeout_s: float) -> T:
    def on_alarm(signum: int, frame: Any) -> None:
        raise _Alarm()

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn()
    except _Alarm:
        raise VerifierTimeout(f"math verification took longer than {timeout_s:g}s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            left = max(old_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


def _call_in_thread(fn: Callable[[], T], timeout_s: float) -> T:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    helper = threading.Thread(target=run, name="asyncrl-math-verify", daemon=True)
    helper.start()
    helper.join(timeout_s)
    if helper.is_alive():
        raise VerifierTimeout(f"math verification took longer than {timeout_s:g}s (helper thread abandoned)")
    if "error" in box:
        raise box["error"]
    return box["value"]
