"""asyncrl's one HTTP stack, on aiohttp's public API: every server (the engine server, its
OpenAI-compatible door, the reward server) and every client (``RemoteEngine``, ``RemoteRewardClient``).

- :mod:`asyncrl.web.server`: :class:`JsonServer`, an ``aiohttp.web.Application`` with a router (each
  server's table of :class:`Route`) and middlewares for the answers, the API key and the limits (body
  size, the request deadline);
- :mod:`asyncrl.web.connection`: a request's head deadline (slowloris), the half-close, malformed HTTP
  in the server's JSON shape (the one aiohttp hook, and why, is said there);
- :mod:`asyncrl.web.schema`: request bodies as typed schemas, checked in one place (:func:`parse_body`);
- :mod:`asyncrl.web.checks`: :class:`HTTPError` and the JSON checks every route shares;
- :mod:`asyncrl.web.client`: :class:`JsonClient`, the one client (a keep-alive ``aiohttp.ClientSession``
  per event loop; a synchronous call for code without a loop).

Imports ``auth`` only, so that both ``rollout`` and ``reward`` may use it (DESIGN §2).
"""

from asyncrl.web.checks import HTTPError, is_finite, is_int, is_num, parse_json
from asyncrl.web.client import JsonClient
from asyncrl.web.schema import SchemaError, Spec, parse_body
from asyncrl.web.server import JsonServer, RawBody, Request, Route

__all__ = [
    "HTTPError",
    "JsonClient",
    "JsonServer",
    "RawBody",
    "Request",
    "Route",
    "SchemaError",
    "Spec",
    "is_finite",
    "is_int",
    "is_num",
    "parse_body",
    "parse_json",
]
