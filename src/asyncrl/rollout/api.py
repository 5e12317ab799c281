"""``RolloutEngine``: the engine interface that workflows, the controller, launchers and the pool use.

Owns the seam between generation and everything that drives it. The implementations satisfy it
structurally (no base class): ``LocalEngine`` (decodes in its own thread), ``RemoteEngine`` (HTTP
client of an engine server), ``EnginePool`` (several engines behind one), and the Ray clients
``RayEngineClient`` / ``ServedEngineClient`` (``launch.ray_clients``). ``tests/rollout/test_api.py``
checks each one against it.

The members are exactly those called today:

- ``generate`` - by the workflows (``interruptible.generate_group``) and the pool;
- ``reports_each_sample`` - by ``generate_group``: True when ``generate`` calls ``on_sample_done(i)``
  itself as each sample ends (``LocalEngine``); False when the engine answers a group at once and
  refuses the callback (``refuse_on_sample_done``): ``generate_group`` then reports each sample
  when the call returns;
- ``update_weights``, ``stats`` - by the controller and the launcher's runner;
- ``version``, ``start``, ``pause``, ``resume``, ``abort_all``, ``close`` - by the pool on its
  members, by the engine server and the Ray engine actor on the engine they wrap, by launchers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Completion, WeightUpdate

__all__ = ["RolloutEngine", "SampleDone", "refuse_on_sample_done"]

SampleDone = Callable[[int], None]
"""``on_sample_done(i)``: sample ``i`` of a ``generate`` call has finished (``stop``/``length``)."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates samples with per-token behaviour log-probs and versions; takes weights in flight."""

    @property
    def version(self) -> int:
        """The version of the weights the engine decodes with (the last update it took)."""
        ...

    @property
    def reports_each_sample(self) -> bool:
        """Whether ``generate`` calls ``on_sample_done`` itself (else it refuses one)."""
        ...

    def start(self) -> None:
        """Start decoding (idempotent; a no-op for engines that run elsewhere)."""
        ...

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        n: int = 1,
        on_sample_done: SampleDone | None = None,
    ) -> list[Completion]:
        """``n`` samples of one prompt, each finished (``stop``/``length``) or interrupted by a
        weight update (``abort``, partial output, resumed by ``generate_group``)."""
        ...

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load ``update`` between two decode steps; afterwards ``version == update.version``."""
        ...

    async def pause(self) -> None:
        """Stop decoding; running samples keep their state."""
        ...

    async def resume(self) -> None:
        """Undo ``pause``."""
        ...

    async def abort_all(self) -> int:
        """End every running sample now with ``finish_reason="abort"``; returns how many."""
        ...

    def stats(self) -> dict[str, float]:
        """Cumulative counters (at least ``generated_tokens``); never blocks the event loop."""
        ...

    def close(self) -> None:
        """Release the engine (its thread, connections or actor)."""
        ...


def refuse_on_sample_done(engine: object, on_sample_done: SampleDone | None) -> None:
    """For engines whose ``reports_each_sample`` is False: a callback passed anyway is an error,
    not silently dropped (``generate_group`` reports samples for such engines)."""
    if on_sample_done is not None:
        raise ValueError(
            f"{type(engine).__name__} answers a group at once (reports_each_sample is False); "
            "it takes no on_sample_done (generate_group reports each sample when the call returns)"
        )


def check_prompt_ids(input_ids: Sequence[int], *, max_seq_len: int, vocab_size: int) -> list[int]:
    """The prompt of a ``generate`` call as a list of ints, or a ``ValueError`` saying what is wrong with it
    (not ints, empty, no room left in ``max_seq_len``, an id outside ``[0, vocab_size)``): the check every
    in-process engine makes before it queues anything."""
    try:
        prompt = [int(t) for t in input_ids]
    except (TypeError, ValueError) as e:
        raise ValueError(f"input_ids must be a sequence of ints: {e}") from None
    if not prompt:
        raise ValueError("input_ids is empty")
    if len(prompt) >= max_seq_len:
        raise ValueError(f"prompt has {len(prompt)} tokens; max_seq_len={max_seq_len} leaves no room")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise ValueError(f"input_ids must lie in [0, vocab_size={vocab_size})")
    return prompt
