"""Which errors ``asyncrl`` prints as one line (no traceback), and with which exit code.

Owns ``known_error(exc)``: the message of an error is the whole story when the user can act on it
alone: a run stopped by a full disk (``storage.DiskFull``, however deep it was wrapped) or by a
verifier that keeps failing (``controller.scoring.ScoringFailed``): exit 1, fix it, then resume; or
bad input found before anything ran (a dataset row, an input row of ``asyncrl generate``, a model
directory, a model the local engine cannot run, a KV cache larger than memory, a run with no checkpoint
that verifies, a path this user cannot write or that is a file where a directory is needed): exit 2.
Anything else is a bug, whose traceback is wanted. docs/bad_input.md lists what each one says.
"""

from __future__ import annotations

from asyncrl.storage import find_disk_full


def known_error(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for ``exc`` (see the module docstring); None: not one of them."""
    full = find_disk_full(exc)
    if full is not None:
        return 1, str(full)
    # imported here, not at the top: the CLI starts without torch
    from asyncrl.controller.resume import CheckpointError
    from asyncrl.controller.scoring import ScoringFailed
    from asyncrl.data.rows import DatasetError
    from asyncrl.models import ModelDirError
    from asyncrl.rollout.batch_generate import InputRowsError
    from asyncrl.rollout.kv_forward import UnsupportedModelError
    from asyncrl.rollout.memory import KVCacheTooLarge

    stopped = next((e for e in (exc, exc.__cause__) if isinstance(e, ScoringFailed)), None)
    if stopped is not None:
        return 1, str(stopped)
    if isinstance(exc, (DatasetError, InputRowsError, ModelDirError, UnsupportedModelError, KVCacheTooLarge)):
        return 2, str(exc)
    if isinstance(exc, CheckpointError):
        return 2, str(exc)
    if isinstance(exc, (PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)):
        where = f" {exc.filename}" if exc.filename else ""
        return 2, f"cannot use{where}: {exc.strerror or exc}; choose a path this user can write"
    return None
