"""When a policy snapshot is due (``controller.snapshot_every_s``); saving goes through the trainer."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from asyncrl.controller.snapshots import PolicySnapshots


class _Trainer:
    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_pretrained(self, directory, tokenizer=None) -> None:
        self.saved.append(str(directory))


def test_snapshots_start_then_every_interval_then_final(tmp_path) -> None:
    logged: list[dict] = []
    snaps = PolicySnapshots(10.0, tmp_path, logged.append)
    trainer = _Trainer()

    async def run() -> None:
        with ThreadPoolExecutor(1) as pool:
            for version, t in ((0, 0.0), (1, 4.0), (2, 10.5), (3, 15.0), (4, 21.0)):
                await snaps.maybe_save(pool, trainer, None, version, version, t)
            await snaps.maybe_save(pool, trainer, None, 4, 4, 22.0, final=True)  # already saved: no copy
            await snaps.maybe_save(pool, trainer, None, 5, 5, 23.0, final=True)

    asyncio.run(run())
    assert [r["version"] for r in logged] == [0, 2, 4, 5]
    assert [r["t"] for r in logged] == [0.0, 10.5, 21.0, 23.0]
    assert trainer.saved == [str(tmp_path / "snapshots" / f"v{v:06d}") for v in (0, 2, 4, 5)]


def test_no_snapshots_when_off(tmp_path) -> None:
    snaps = PolicySnapshots(0.0, tmp_path, lambda record: None)
    assert not snaps.due(0, 0.0) and not snaps.due(3, 100.0, final=True)
