"""The LLM-as-judge verifier: ``task.verifier=judge:<OpenAI-compatible base URL>[#model]``.

Owns :class:`JudgeTarget` (what ``reward.verifiers.resolve_verifier`` returns for a ``judge:`` name),
:class:`JudgeClient` (one per judge URL in the reward service) and :func:`parse_verdict`.

A judge is any OpenAI-compatible chat-completions endpoint: ``asyncrl serve engine`` (an engine of this
project, ``judge:http://127.0.0.1:8000/v1``), vLLM, SGLang or a hosted API. For each response the client asks
it, at temperature 0, whether the response answers the question as the reference does (:data:`TEMPLATE`: the
question, the reference, the response; the judge ends with ``VERDICT: CORRECT`` or ``VERDICT: INCORRECT``),
and the reward is 1.0 or 0.0. The model is the URL's ``#fragment``, else ``default`` (a server serving one
model answers to any name, as ``asyncrl serve engine`` does); the key is ``$ASYNCRL_JUDGE_API_KEY``, else none.

Batched: the reward service hands every pending judgement to the client at once (the workflow scores a
group's G responses concurrently), and the client keeps up to ``max_batch`` of them in flight on one
keep-alive connection pool, so the judge's engine batches them (continuous batching) instead of answering
one by one; more wait for a slot. Failure handling is the reward service's (``RewardService``): each call
has the service's remote timeout (a judge that does not answer is a ``timeout``, never a 0); no answer,
a refused connection or a 5xx is an infrastructure failure (:class:`~asyncrl.reward.InfrastructureError`,
retried up to ``reward.max_retries``); a 4xx or a reply without a readable verdict is an error; each of
these marks the sample instead of scoring it, and verdicts are cached like every verifier's.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from asyncrl.auth import auth_headers
from asyncrl.reward import InfrastructureError
from asyncrl.web import JsonClient

__all__ = ["TEMPLATE", "JudgeClient", "JudgeTarget", "parse_verdict"]

TEMPLATE = """You are grading an answer to a question against a reference answer.

Question:
{question}

Reference answer:
{reference}

Answer to grade:
{response}

Is the answer to grade correct, that is, does it reach the same final answer as the reference?
Reply with one line: VERDICT: CORRECT or VERDICT: INCORRECT."""
"""The judge's prompt (one user message)."""

MAX_TOKENS = 64
"""Tokens the judge may write (the verdict line, and a little reasoning before it)."""
_VERDICT = re.compile(r"VERDICT:\s*(CORRECT|INCORRECT)", re.IGNORECASE)


@dataclass(frozen=True)
class JudgeTarget:
    """An LLM judge behind an OpenAI-compatible endpoint."""

    url: str
    """``http(s)://host:port[/path]``: the API's base (``/chat/completions`` is appended)."""
    model: str = "default"


def parse_verdict(text: str) -> float:
    """1.0 / 0.0 from the judge's reply (its last ``VERDICT:`` line); ValueError when it has none."""
    found = _VERDICT.findall(text)
    if not found:
        raise ValueError(f"the judge's reply has no verdict: {text[:120]!r}")
    return 1.0 if found[-1].upper() == "CORRECT" else 0.0


class JudgeClient:
    """Asks one judge endpoint for verdicts, at most ``max_batch`` at once (see the module docstring)."""

    def __init__(self, target: JudgeTarget, *, timeout_s: float = 30.0, max_batch: int = 16) -> None:
        parts = urlsplit(target.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"judge URL must be http(s)://host:port[/path], got {target.url!r}")
        self.target = target
        self.timeout_s = timeout_s
        self.max_batch = max_batch
        self._slots = asyncio.Semaphore(max_batch)
        headers = auth_headers(os.environ.get("ASYNCRL_JUDGE_API_KEY") or None)
        base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self._http = JsonClient(base, headers, max_connections=max_batch)
        self.in_flight = 0
        self.max_in_flight = 0
        """The most judgements in flight at once (how well requests were batched)."""

    def _body(self, question: str, response: str, reference: str) -> bytes:
        content = TEMPLATE.format(question=question, reference=reference, response=response)
        return json.dumps(
            {
                "model": self.target.model,
                "messages": [{"role": "user", "content": content}],
                "temperature": 0.0,
                "max_tokens": MAX_TOKENS,
            }
        ).encode()

    async def judge(self, question: str, response: str, reference: str) -> float:
        """The verdict on ``response``: 1.0 or 0.0; raises asyncio.TimeoutError (none in ``timeout_s``),
        InfrastructureError (no connection, 5xx) or ValueError (4xx, no readable verdict)."""
        async with self._slots:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                status, data = await self._http.request(
                    "POST", "/chat/completions", self._body(question, response, reference), timeout=self.timeout_s
                )
            except asyncio.TimeoutError:
                raise  # no verdict in time: the service's "timeout" (an OSError on 3.11, so said first)
            except (aiohttp.ClientError, OSError) as e:
                raise InfrastructureError(f"judge at {self.target.url} unreachable: {e!r}") from e
            finally:
                self.in_flight -= 1
        if status >= 500:
            raise InfrastructureError(f"judge at {self.target.url} answered {status}: {data[:200]!r}")
        if status != 200:
            raise ValueError(f"judge at {self.target.url} refused the request ({status}): {data[:200]!r}")
        try:
            text = json.loads(data)["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ValueError(f"judge at {self.target.url} sent no chat completion ({type(e).__name__})") from None
        return parse_verdict(text)

    async def close(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()
