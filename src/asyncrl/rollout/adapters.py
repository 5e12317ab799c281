"""LoRA adapters in ``LocalEngine``: several weight versions held at once over one set of base weights.

Owns the engine-side form of an adapter-only ``WeightUpdate`` (``WeightUpdate.adapter``: per adapted
linear layer ``(A, B, scaling)``) and the record of one servable weight version:

- ``prepare_adapter(model, layers)`` checks every name and shape against the model and fuses the factors
  the way ``SlotKVForward`` fuses its weights: one low-rank term for q|k|v and one for gate|up (the
  factors' ranks stacked, ``B`` block-diagonal, the scaling folded into ``B``), one each for o, down and
  an untied ``lm_head``. The delta of a layer is then ``(x @ a.T) @ b.T`` for the rows it applies to.
- ``HeldWeights``: a version the engine can serve now: the base weights alone (``adapter is None``) or
  the base weights plus one adapter. A request is pinned to one at admission and keeps it to its end.
- ``LoraRows``: which rows of one forward take which adapter (rows of different versions in one batch:
  base output for every row, then the low-rank deltas: with one adapter on every row, its own; with
  several, every adapter's factors stacked along the rank and a row-by-block mask, so that a step costs
  two matmuls per layer whatever the number of versions in it; ``StackCache`` keeps the stacks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Adapter",
    "HeldWeights",
    "LayerAdapter",
    "LoraRows",
    "LowRank",
    "StackCache",
    "TermKey",
    "VersionNotHeld",
    "prepare_adapter",
]

TermKey = tuple[int, str]
"""A low-rank term of an adapter: (layer index, ``qkv``/``o``/``gu``/``down``), or (-1, ``lm_head``)."""

_ATTN = ("q_proj", "k_proj", "v_proj")
_MLP = ("gate_proj", "up_proj")


class VersionNotHeld(LookupError):
    """A request named a weight version the engine no longer (or never) held."""


@dataclass(frozen=True)
class LowRank:
    """One fused low-rank term: ``delta = (x @ a.T) @ b.T`` (the scaling is folded into ``b``)."""

    a: torch.Tensor
    """[rank, in]"""
    b: torch.Tensor
    """[out, rank]"""

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.a.T) @ self.b.T


@dataclass(frozen=True)
class LayerAdapter:
    """The low-rank terms of one decoder layer (None where no projection of the group is adapted)."""

    qkv: LowRank | None
    """Over the concatenated q|k|v output (the layout of ``SlotKVForward``'s fused projection)."""
    o: LowRank | None
    gu: LowRank | None
    """Over the concatenated gate|up output."""
    down: LowRank | None


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter ready for ``SlotKVForward.step`` (``prepare_adapter``)."""

    layers: tuple[LayerAdapter, ...]
    lm_head: LowRank | None
    nbytes: int
    """Bytes of the factors as received (A and B of every adapted layer)."""

    def term(self, key: TermKey) -> LowRank | None:
        layer, name = key
        return self.lm_head if name == "lm_head" else getattr(self.layers[layer], name)


@dataclass(eq=False)
class HeldWeights:
    """One weight version the engine serves now (compared by identity: the same version number may be
    published twice, e.g. a reloaded adapter, and each publication is its own entry)."""

    version: int
    adapter: Adapter | None
    """None: the base weights themselves."""


def _module_shapes(model: Any) -> dict[str, tuple[int, int]]:
    """Adaptable linear layers of a Llama-family model: HF name -> (out_features, in_features)."""
    shapes: dict[str, tuple[int, int]] = {}
    for i, layer in enumerate(model.model.layers):
        for group, names in (("self_attn", (*_ATTN, "o_proj")), ("mlp", (*_MLP, "down_proj"))):
            for name in names:
                w = getattr(getattr(layer, group), name).weight
                shapes[f"model.layers.{i}.{group}.{name}"] = (w.shape[0], w.shape[1])
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        shapes["lm_head"] = tuple(model.lm_head.weight.shape)  # type: ignore[assignment]
    return shapes


def _fuse(
    parts: Sequence[tuple[int, tuple[torch.Tensor, torch.Tensor, float] | None]],
    dtype: torch.dtype,
    device: torch.device,
) -> LowRank | None:
    """One low-rank term over the concatenated outputs of ``parts`` ((out_features, factors or None) each):
    the A factors stacked, B block-diagonal with each part's scaling folded in."""
    present = [f for _, f in parts if f is not None]
    if not present:
        return None
    rank = sum(f[0].shape[0] for f in present)
    a = torch.cat([f[0].detach().to(device=device, dtype=torch.float32) for f in present], 0)
    b = torch.zeros(sum(out for out, _ in parts), rank, dtype=torch.float32, device=device)
    row = col = 0
    for out, f in parts:
        if f is not None:
            r = f[0].shape[0]
            b[row : row + out, col : col + r] = f[1].detach().to(device=device, dtype=torch.float32) * float(f[2])
            col += r
        row += out
    return LowRank(a.to(dtype).contiguous(), b.to(dtype).contiguous())


def prepare_adapter(
    model: Any, layers: Mapping[str, tuple[Any, Any, float]], *, dtype: torch.dtype, device: torch.device
) -> Adapter:
    """Check an adapter-only update against ``model`` and fuse it for the forward (module docstring).

    Raises ``KeyError`` for a name that is not an adaptable linear layer of the model (an embedding, a tied
    ``lm_head``) and ``ValueError`` for factors of the wrong shape, before anything is built."""
    shapes = _module_shapes(model)
    unknown = [k for k in layers if k not in shapes]
    if unknown:
        raise KeyError(f"adapter update: {unknown[:5]} are not adaptable linear layers of this model")
    nbytes = 0
    for name, (a, b, scaling) in layers.items():
        out, inp = shapes[name]
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != inp or b.shape[0] != out or a.shape[0] != b.shape[1]:
            raise ValueError(
                f"adapter update: {name} has A {tuple(a.shape)}, B {tuple(b.shape)}; want A [r, {inp}], B [{out}, r]"
            )
        if not isinstance(scaling, int | float):
            raise ValueError(f"adapter update: {name} has scaling {scaling!r}, not a number")
        nbytes += a.numel() * a.element_size() + b.numel() * b.element_size()

    def part(i: int, group: str, name: str) -> tuple[int, tuple[Any, Any, float] | None]:
        key = f"model.layers.{i}.{group}.{name}"
        return shapes[key][0], layers.get(key)

    fused = [
        LayerAdapter(
            qkv=_fuse([part(i, "self_attn", n) for n in _ATTN], dtype, device),
            o=_fuse([part(i, "self_attn", "o_proj")], dtype, device),
            gu=_fuse([part(i, "mlp", n) for n in _MLP], dtype, device),
            down=_fuse([part(i, "mlp", "down_proj")], dtype, device),
        )
        for i in range(len(model.model.layers))
    ]
    head = _fuse([(shapes["lm_head"][0], layers["lm_head"])], dtype, device) if "lm_head" in layers else None
    return Adapter(tuple(fused), head, nbytes)


class StackCache:
    """The stacked factors of each set of adapters that shared a step, term by term, built on first use
    (cleared whenever the held versions change)."""

    def __init__(self) -> None:
        self._sets: dict[tuple[int, ...], dict[TermKey, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]] = {}

    def clear(self) -> None:
        self._sets.clear()

    def stacked(
        self, adapters: tuple[Adapter, ...], key: TermKey
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(A of every adapter stacked [sum r, in], B side by side [out, sum r], the adapter of each rank
        column [sum r]); None when no adapter has the term."""
        terms = self._sets.setdefault(tuple(id(a) for a in adapters), {})
        if key not in terms:
            parts = [(g, a.term(key)) for g, a in enumerate(adapters)]
            parts = [(g, t) for g, t in parts if t is not None]
            if not parts:
                terms[key] = None
            else:
                a = torch.cat([t.a for _, t in parts], 0)
                b = torch.cat([t.b for _, t in parts], 1)
                cols = torch.cat([torch.full((t.a.shape[0],), g, device=a.device) for g, t in parts])
                terms[key] = (a, b, cols)
        return terms[key]


@dataclass(frozen=True)
class LoraRows:
    """Which rows of one forward take which adapter: row ``i`` takes ``adapters[row_group[i]]`` (-1: none,
    the base weights); ``row_group`` None: ``adapters[0]`` on every row."""

    adapters: tuple[Adapter, ...]
    row_group: torch.Tensor | None
    stacks: StackCache | None = None
    masks: dict[TermKey, torch.Tensor] = field(default_factory=dict)
    """Each term's row-by-rank-column mask for these rows (1 where the column's adapter is the row's)."""

    @classmethod
    def build(cls, rows: Sequence[Adapter | None], device: torch.device, stacks: StackCache) -> LoraRows | None:
        """The groups of ``rows`` (each row's adapter; None: the base weights, or an idle row whose output
        is dropped); None when no row takes an adapter."""
        order: dict[int, int] = {}
        adapters: list[Adapter] = []
        groups: list[int] = []
        for adapter in rows:
            if adapter is None:
                groups.append(-1)
                continue
            g = order.get(id(adapter))
            if g is None:
                g = order[id(adapter)] = len(adapters)
                adapters.append(adapter)
            groups.append(g)
        if not adapters:
            return None
        return cls(tuple(adapters), torch.tensor(groups, dtype=torch.long, device=device), stacks)

    @classmethod
    def every_row(cls, adapter: Adapter) -> LoraRows:
        """One adapter on every row of the forward."""
        return cls((adapter,), None)

    def subset(self, rows: torch.Tensor | slice) -> LoraRows:
        """The groups of ``x[rows]`` (for the logits of a subset of the rows)."""
        if self.row_group is None:
            return self
        return LoraRows(self.adapters, self.row_group[rows], self.stacks)

    def add(self, out: torch.Tensor, x: torch.Tensor, key: TermKey) -> torch.Tensor:
        """``out`` plus the low-rank delta of term ``key`` of each row's adapter of ``x``, in place."""
        if self.row_group is None:
            low_rank = self.adapters[0].term(key)
            if low_rank is not None:
                out += low_rank.delta(x)
            return out
        assert self.stacks is not None
        stacked = self.stacks.stacked(self.adapters, key)
        if stacked is None:
            return out
        a, b, cols = stacked
        mask = self.masks.get(key)
        if mask is None:
            mask = self.masks[key] = (self.row_group[:, None] == cols[None, :]).to(x.dtype)
        out += ((x @ a.T) * mask) @ b.T
        return out
