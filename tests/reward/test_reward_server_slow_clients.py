"""The reward server against slow clients (issue 14 item 6): a request not complete within
``read_timeout_s`` of its first byte gets 408 and its connection is closed, however slowly its bytes
trickle in, and a connection that sends nothing is closed that long after, while other clients are
scored. (Invalid UTF-8 and huge bodies: ``test_remote_reward.py``.)"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import pytest

from asyncrl.reward.client import RemoteRewardClient
from asyncrl.reward.remote import RewardServer


@pytest.fixture(scope="module")
def server() -> Iterator[RewardServer]:
    with RewardServer(num_workers=1, timeout_s=10, read_timeout_s=0.5) as srv:
        yield srv


# The server's read deadline is 0.5 s, its default 30 s. A reply within HANG_S is the 0.5 s deadline honoured
# (not the default, not none), however late a loaded machine gets round to it.
HANG_S = 20.0


def _reply(sock: socket.socket) -> bytes:
    sock.settimeout(HANG_S + 5)
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    return reply


def _answer(sock: socket.socket) -> tuple[int, dict, bytes]:
    reply = _reply(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body), reply


@pytest.mark.parametrize(
    "sent",
    [
        b"POST /score HTTP/1.1\r\nHost: x\r\n",  # headers never finished
        b'POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"response": ',  # body never finished
    ],
    ids=["headers", "body"],
)
def test_a_stalled_request_gets_408_and_others_are_scored(server: RewardServer, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as slow:
        slow.sendall(sent)
        t0 = time.perf_counter()
        assert RemoteRewardClient(server.url).score_sync("\\boxed{2}", "2") == (1.0, None)  # meanwhile
        status, body, _ = _answer(slow)
    assert status == 408 and body == {"error": "request not complete within 0.5 s of its first byte"}
    assert time.perf_counter() - t0 < HANG_S  # the 0.5 s deadline, not the default 30 s


def test_a_silent_connection_is_closed_without_an_answer(server: RewardServer) -> None:
    """Nothing was asked, so nothing is answered (a keep-alive client reconnects, as from any idle close)."""
    with socket.create_connection(("127.0.0.1", server.port)) as silent:
        t0 = time.perf_counter()
        assert RemoteRewardClient(server.url).score_sync("\\boxed{2}", "2") == (1.0, None)  # meanwhile
        assert _reply(silent) == b""
    assert 0.4 < time.perf_counter() - t0 < HANG_S  # closed at the 0.5 s deadline (load only delays it)


def test_a_trickling_client_slowloris_is_cut_off(server: RewardServer) -> None:
    """The client keeps trickling (a byte every 20 ms: every read is quick, the request never ends) until
    the server answers: cut off while bytes still arrive, so the deadline runs from the first byte and is
    not renewed by each read. Counted, not timed: the load may delay the answer, not let it wait for an end
    of trickle (a renewed deadline would answer only HANG_S later, after the client stops)."""
    request = b"POST /score HTTP/1.1\r\nHost: x\r\nX-Slow: "
    t0 = time.perf_counter()
    cut_off_while_trickling = False
    with socket.create_connection(("127.0.0.1", server.port)) as slow:
        slow.sendall(request)
        while time.perf_counter() - t0 < HANG_S:
            if select.select([slow], [], [], 0)[0]:  # the answer (or the close) is there
                cut_off_while_trickling = True
                break
            try:
                slow.sendall(b"a")
            except OSError:  # closed by the server
                cut_off_while_trickling = True
                break
            time.sleep(0.02)
        status, _, _ = _answer(slow)
    assert status == 408 and cut_off_while_trickling
    assert RemoteRewardClient(server.url).score_sync("\\boxed{3}", "3") == (1.0, None)


def test_a_slow_verifier_is_not_cut_off(server: RewardServer) -> None:
    """The deadline covers reading the request, not scoring it: a request read at once may take longer."""
    client = RemoteRewardClient(server.url + "#code")
    program = "import time\ntime.sleep(1.0)\ndef f():\n    return 1\n"
    assert client.score_sync(program, "assert f() == 1") == (1.0, None)
