"""``asyncrl.auth``: key resolution, the loopback rule, the per-request decision, refusal logging
and path confinement (the servers' own tests check that they use it on every route)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from asyncrl.auth import (
    API_KEY_ENV,
    LOG_BURST,
    ApiKeyAuth,
    InsecureBindError,
    PathOutsideRoot,
    auth_headers,
    check_bind,
    confine_path,
    is_loopback,
    new_api_key,
    resolve_api_key,
)


def test_resolve_api_key_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_key() is None
    monkeypatch.setenv(API_KEY_ENV, "")
    assert resolve_api_key() is None  # empty is unset
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key() == "from-env"
    (tmp_path / "key").write_text("from-file\nsecond line\n")
    assert resolve_api_key(key_file=str(tmp_path / "key")) == "from-file"
    assert resolve_api_key("explicit", str(tmp_path / "key")) == "explicit"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        resolve_api_key(key_file=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="cannot read"):
        resolve_api_key(key_file=str(tmp_path / "missing"))


def test_new_keys_are_fresh_and_long() -> None:
    keys = {new_api_key() for _ in range(50)}
    assert len(keys) == 50 and all(len(k) >= 40 for k in keys)
    assert auth_headers(None) == {} and auth_headers("k") == {"Authorization": "Bearer k"}


@pytest.mark.parametrize(
    "host,loop",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("", False),
        ("::", False),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
    ],
)
def test_is_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def test_non_loopback_bind_needs_a_key() -> None:
    check_bind("127.0.0.1", False, "engine server")
    check_bind("0.0.0.0", True, "engine server")
    with pytest.raises(InsecureBindError, match=r"refusing to start the engine server on 0\.0\.0\.0 without an API"):
        check_bind("0.0.0.0", False, "engine server")
    with pytest.raises(InsecureBindError, match=API_KEY_ENV):
        check_bind("10.0.0.5", False, "reward server")


def test_decision_and_refusal_log(caplog: pytest.LogCaptureFixture) -> None:
    auth = ApiKeyAuth("s3cret-key", "engine server")
    assert auth.valid("Bearer s3cret-key") and auth.valid("bearer   s3cret-key ")
    for bad in (
        None,
        "",
        "Bearer",
        "Bearer s3cret-ke",
        "Bearer s3cret-key2",
        "Basic s3cret-key",
        "s3cret-key",
        "Bearer é",
    ):
        assert not auth.valid(bad)
    assert auth.allows("GET", "/health", None, "1.2.3.4:5")  # the open route
    assert not auth.allows("GET", "/health_generate", None, "1.2.3.4:5")
    with caplog.at_level(logging.WARNING, logger="asyncrl.auth"):
        assert not auth.allows("POST", "/generate", "Bearer nope", "10.0.0.9:4242")
    line = caplog.records[-1].getMessage()
    assert "'POST'" in line and "'/generate'" in line and "10.0.0.9:4242" in line and "wrong API key" in line
    assert "nope" not in line and "s3cret" not in line
    assert auth.refused == 2
    assert ApiKeyAuth(None, "x").allows("POST", "/anything", None, "?")  # no key: no check


def test_refusal_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    auth = ApiKeyAuth("k", "reward server")
    with caplog.at_level(logging.WARNING, logger="asyncrl.auth"):
        for _ in range(LOG_BURST * 5):
            auth.allows("POST", "/score", None, "peer")
    assert auth.refused == LOG_BURST * 5 and len(caplog.records) == LOG_BURST


def test_confine_path(tmp_path: Path) -> None:
    root = tmp_path / "exports"
    (root / "v00000001").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert confine_path(str(root / "v00000001"), root) == (root / "v00000001").resolve()
    assert confine_path("v00000001", root) == (root / "v00000001").resolve()  # relative: to the root
    assert confine_path(str(root / "v00000009"), root).name == "v00000009"  # missing but inside: the loader says
    (root / "link").symlink_to(outside)
    (root / "v00000001" / "up").symlink_to("../..")
    for escape in (
        str(outside),
        "../elsewhere",
        str(root / ".." / "elsewhere"),
        str(root / "link"),
        "link/x",
        "v00000001/up",
        "v00000001/up/elsewhere",
        "/etc/passwd",
        "a\x00b",
    ):
        with pytest.raises(PathOutsideRoot):
            confine_path(escape, root)
    # a root given through a symlink is the directory it points to
    (tmp_path / "root-link").symlink_to(root)
    assert confine_path("v00000001", tmp_path / "root-link") == (root / "v00000001").resolve()
    assert os.path.realpath(root) in str(confine_path(str(tmp_path / "root-link" / "v00000001"), root))
