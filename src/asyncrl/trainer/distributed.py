"""Data-parallel trainer ranks: process group, FSDP2 sharding, and the leader/follower protocol.

This module owns everything the trainer needs to run on several ranks:

- ``init_distributed()``: the process group from ``torchrun``'s environment (gloo on CPU,
  NCCL on GPU, plus a gloo group for Python objects), wrapped in a ``DistContext`` with the
  few collectives the trainer uses (sums/maxima of metrics, object broadcast and gather).
- ``shard_model(model, ctx, ...)``: ``torch.distributed.fsdp.fully_shard`` on every decoder
  layer and then the root (bf16 parameters / fp32 reductions when mixed precision is on), with
  gradient *summation* across ranks: each rank's loss is already divided by the global
  denominator, so the sum of the ranks' gradients is the gradient of the whole batch.
- ``full_state_dict`` / ``sharded_state_dict`` / ``load_full_state_dict``: the gathered
  (rank 0) and sharded (``DTensor``) views of the weights, and loading a full state dict on
  rank 0 into every rank's shards.
- Two ways to drive the ranks. SPMD: every rank builds its ``Trainer`` and calls the same
  methods in the same order (tests, Ray actors driven by one client). Leader/follower (what
  ``asyncrl train`` uses under ``torchrun``): ``run_distributed(leader_fn)`` runs the whole
  controller on rank 0 (``leader_fn``); its ``Trainer`` broadcasts each call (init, step,
  log-probs, export, checkpoint) as a command, and every other rank runs
  ``run_trainer_worker``, which mirrors those calls on its own shard until the leader stops. The
  follower's trainer comes in as an argument (a ``Follower``: ``Trainer.follower`` builds one), so
  this module imports nothing of ``trainer.trainer``.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist

from asyncrl.config import AlgoConfig, TrainerConfig

T = TypeVar("T")

_LEADER = False
_CONTEXT: DistContext | None = None


@dataclass
class DistContext:
    """One rank's view of the trainer process group."""

    rank: int
    world_size: int
    device: torch.device
    """The device collectives on tensors use (``cuda:LOCAL_RANK`` for NCCL, else CPU)."""
    object_group: Any = None
    """A gloo group for Python-object collectives (None: the default group is gloo already)."""

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Element-wise sum (or max) of a list of floats over ranks."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.tolist()

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """``obj`` from rank ``src`` on every rank."""
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, group=self.object_group)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.object_group)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.object_group)


def init_distributed(
    backend: str | None = None,
    timeout_s: int = 7200,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
) -> DistContext:
    """Initialise the default process group (idempotent).

    By default from the ``torchrun`` environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...);
    processes started otherwise (e.g. trainer children of the controller) pass ``rank``,
    ``world_size`` and ``init_method`` (``tcp://host:port``). ``backend``: None picks NCCL when
    CUDA is available, else gloo."""
    global _CONTEXT
    if _CONTEXT is not None:
        return _CONTEXT
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    backend = backend or ("nccl" if use_cuda else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank or 0)))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        explicit = {"init_method": init_method, "rank": rank, "world_size": world_size} if init_method else {}
        dist.init_process_group(backend=backend, timeout=timeout, **explicit)
    object_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    _CONTEXT = DistContext(dist.get_rank(), dist.get_world_size(), device, object_group)
    return _CONTEXT


def current_context() -> DistContext | None:
    """The trainer's context when a process group of more than one rank is up, else None."""
    global _CONTEXT
    if _CONTEXT is not None:
        return _CONTEXT if _CONTEXT.world_size > 1 else None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        _CONTEXT = DistContext(dist.get_rank(), dist.get_world_size(), device, group)
        return _CONTEXT
    return None


def is_leader() -> bool:
    """True inside ``run_distributed``'s ``leader_fn`` on rank 0 (the Trainer then leads)."""
    return _LEADER


def shutdown_distributed() -> None:
    """Destroy the process group (end of a distributed run)."""
    global _CONTEXT, _LEADER
    if dist.is_available() and dist.is_initialized():
        # Sharded parameters keep their device mesh, and with it the process group, alive; if
        # they are only collected at interpreter exit, the group's transport threads are torn
        # down in arbitrary order and the process aborts ("terminate called without an active
        # exception"). Collect the dead trainer first, and let every rank get here before any
        # closes its connections.
        gc.collect()
        dist.barrier(group=_CONTEXT.object_group if _CONTEXT is not None else None)
        dist.destroy_process_group()
        gc.collect()
    _CONTEXT = None
    _LEADER = False


# ----------------------------------------------------------------------------------- sharding
def _layer_classes(model: Any) -> set[str]:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(getattr(inner, "_no_split_modules", None) or [])


def shard_model(model: torch.nn.Module, ctx: DistContext, *, mixed_precision: bool = False) -> torch.nn.Module:
    """FSDP2-shard ``model`` in place over all ranks: every decoder layer, then the root.

    Gradients are summed over ranks (divide factor 1): the trainer divides each rank's loss by
    the global denominator, so the sum is the whole batch's gradient."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    classes = _layer_classes(model)
    for module in model.modules():
        if type(module).__name__ in classes:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on rank 0, on CPU; an empty dict on the other ranks.
    A collective: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def sharded_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """This rank's shards (``DTensor`` values under the usual names; e.g. for ``torch.distributed.checkpoint``)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model)


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor], *, strict: bool = True) -> None:
    """Load a full state dict held by rank 0 (others pass ``{}``) into every rank's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(
        model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
    )


def full_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Optimizer state keyed by parameter names, gathered on rank 0 (same format as one rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], *, from_rank0: bool
) -> None:
    """Load a name-keyed optimizer state (rank 0's copy broadcast when ``from_rank0``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        model, optimizer, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=from_rank0)
    )


# ----------------------------------------------------------------------------------- leader / follower
def send_command(ctx: DistContext, name: str, payload: Any = None) -> None:
    """Leader side: tell every follower to run ``name`` with ``payload``."""
    ctx.broadcast_object((name, payload))


def init_payload(
    model: Any, dtype: torch.dtype, train_cfg: TrainerConfig, algo_cfg: AlgoConfig, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The leader's ``init`` command: the model's architecture and dtype, the configs and the trainer's
    keyword arguments (a follower's ``Trainer.follower`` builds the same trainer from it)."""
    return {
        "model_config": model.config,
        "dtype": dtype,
        "train_cfg": train_cfg,
        "algo_cfg": algo_cfg,
        "kwargs": kwargs,
    }


def build_follower_model(payload: dict[str, Any]) -> Any:
    """A model of the leader's architecture (weights arrive from rank 0 afterwards)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(payload["model_config"], dtype=payload["dtype"])


class Follower(Protocol):
    """A non-zero rank's trainer, as the follower loop drives it (``Trainer`` is one)."""

    def follow(self, name: str, payload: Any) -> None:
        """Run the leader's command ``name`` (``train_step``, ``compute_logprobs``, ``state_dict``,
        ``save_checkpoint``, ``load_checkpoint``) with ``payload`` on this rank's shard."""
        ...


FollowerFactory = Callable[[dict[str, Any]], Follower]
"""Builds a rank's ``Follower`` from the leader's ``init`` payload (``Trainer.follower``)."""


def run_trainer_worker(make_follower: FollowerFactory, ctx: DistContext | None = None) -> int:
    """Follower loop of a non-zero rank: mirror the leader's trainer calls until it stops.

    Returns the number of training steps taken. The leader's ``Trainer`` sends ``init`` (model
    architecture, configs: ``make_follower`` builds this rank's trainer from it), then any of
    ``train_step``, ``compute_logprobs``, ``state_dict``, ``save_checkpoint``, ``load_checkpoint``
    (each run by ``Follower.follow``), and finally ``stop``."""
    ctx = ctx or current_context()
    if ctx is None or ctx.rank == 0:
        raise RuntimeError("run_trainer_worker runs on a non-zero rank of an initialised process group")
    follower: Follower | None = None
    steps = 0
    while True:
        name, payload = ctx.broadcast_object()
        if name == "stop":
            return steps
        if name == "init":
            follower = make_follower(payload)
            continue
        if follower is None:
            raise RuntimeError(f"follower got {name!r} before init")
        follower.follow(name, payload)
        if name == "train_step":
            steps += 1


def run_distributed(
    leader_fn: Callable[[], T],
    *,
    follower: FollowerFactory,
    backend: str | None = None,
    timeout_s: int = 7200,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
) -> T | None:
    """Entry point for every ``torchrun`` rank: rank 0 runs ``leader_fn`` (the controller and
    its ``Trainer``, which leads), the other ranks follow (``run_trainer_worker`` with ``follower``,
    ``Trainer.follower`` for ``asyncrl train``). Returns ``leader_fn``'s result on
    rank 0 and None elsewhere.

    When ``leader_fn`` raises, the exception propagates without a ``stop`` (the followers may be
    inside a collective that no longer pairs with one): rank 0's process ends and ``torchrun``
    tears the other ranks down (processes started without ``torchrun`` must be reaped by their
    parent). ``rank``/``world_size``/``init_method``: see ``init_distributed``."""
    global _LEADER
    ctx = init_distributed(backend, timeout_s, rank=rank, world_size=world_size, init_method=init_method)
    if ctx.rank != 0:
        run_trainer_worker(follower, ctx)
        shutdown_distributed()
        return None
    _LEADER = True
    try:
        result = leader_fn()
    finally:
        _LEADER = False
    send_command(ctx, "stop")
    shutdown_distributed()
    return result
