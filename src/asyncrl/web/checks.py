"""What every route of every asyncrl server shares: :class:`HTTPError` (a 4xx with a message for the
client) and the JSON checks (:func:`parse_json`, :func:`is_int`, :func:`is_num`, :func:`is_finite`).

JSON as Python reads it carries ``NaN`` and ``Infinity``: ``is_finite`` refuses them. Imports nothing
of the project.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["HTTPError", "dumps", "is_finite", "is_int", "is_num", "parse_json"]


class HTTPError(Exception):
    """A request the server rejects with ``status`` (4xx) and a message for the client; ``close``:
    close the connection after answering; ``code``: a machine-readable error code for the error body
    (e.g. OpenAI's ``model_not_found``), handed to ``error_body`` as its third argument when set."""

    def __init__(self, status: int, message: str, close: bool = False, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        self.code = code


def parse_json(body: bytes) -> Any:
    """A request body as JSON (None when empty); 400 when malformed, nested too deeply for the parser, or
    holding an integer of more digits than Python reads (``sys.get_int_max_str_digits``)."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise HTTPError(400, f"malformed JSON body: {e}") from None
    except RecursionError:
        raise HTTPError(400, "malformed JSON body: nested too deeply") from None


def dumps(payload: Any) -> bytes:
    """A JSON answer's bytes (compact)."""
    return json.dumps(payload, separators=(",", ":")).encode()


def is_int(v: Any) -> bool:
    """An int that is not a bool (JSON true/false must not pass as 1/0)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite(v: Any) -> bool:
    """A number (``is_num``) that is a finite float: not NaN, not infinite (``json.loads`` reads ``NaN``,
    ``Infinity``, ``1e999``), not an int too large for a float (``1`` and 400 zeros)."""
    if not is_num(v):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False
