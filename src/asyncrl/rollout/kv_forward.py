"""The model forward of ``LocalEngine``: a per-slot KV cache over a Hugging Face decoder's modules.

Owns ``SlotKVForward``, which runs a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) with its own
code over the model's weights (``embed_tokens``, ``layers[i].self_attn.{q,k,v,o}_proj`` (+ biases,
+ ``q_norm``/``k_norm``), the two RMSNorms, the gated MLP, ``norm``, ``lm_head``) and the model's
own rotary module, with a preallocated cache ``[layers, slots, kv_heads, max_seq_len, head_dim]``.

- ``step(batch)``: one forward over a ``ForwardBatch``: the decode rows of slots ``[0, rows)`` (one
  token each: its K/V is written at its position, attention covers positions ``<= position`` of its
  own slot) and the prompts of newly admitted requests (causal attention, K/V written into their
  slots); the linear layers run once over all rows. ``prefill(slots, prompts)`` is the prompt-only case.
  A prompt may start past position 0 (``ForwardBatch.prefill_starts``): its slot already holds the KV
  of the tokens before it (prefix reuse across the turns of an episode), which it attends to.
- ``copy_prefix(src, dsts, length)``: share a prompt's KV between the samples of one group.
- LoRA adapters (``step(batch, lora)``, see ``adapters``): rows of one step may run on different adapter
  versions over the same base weights; every linear layer computes its base output for all rows, then adds
  each row group's low-rank delta.

Numerics follow Hugging Face's eager path in fp32 (same op order for rotary and attention), so the
log-probs agree with ``model(input_ids).logits`` to ~1e-6 on CPU. Weights are read from the model's
parameters; ``refresh()`` rebuilds the fused q/k/v and gate/up copies after a weight update.
Architectures outside the family raise ``UnsupportedModelError`` with the reason; a cache larger than
the device's memory allows raises ``rollout.memory.KVCacheTooLarge`` before it is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from asyncrl.rollout.adapters import LoraRows
from asyncrl.rollout.memory import check_kv_fits

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Fusing q/k/v and gate/up into one matmul halves the per-layer op count (Python overhead dominates
# small models) at the cost of a second copy of those weights; above this size it is not worth it.
FUSE_MAX_PARAMS = 200_000_000


class UnsupportedModelError(ValueError):
    """The model is not a Llama-family decoder that ``SlotKVForward`` can run."""


@dataclass(frozen=True)
class ForwardBatch:
    """The rows of one forward (the engine's ``StepPlan.batch``): decode rows, then prompts to prefill."""

    decode_tokens: list[int] = field(default_factory=list)
    """Row i feeds this token to slot i, for the slots ``[0, rows)``."""
    decode_positions: list[int] = field(default_factory=list)
    """Row i's position in its slot; attention covers positions ``<=`` it."""
    decode_write_slots: list[int] = field(default_factory=list)
    """Where row i's K/V go: slot i, or ``SlotKVForward.scratch`` for an idle row."""
    prefill_slots: list[int] = field(default_factory=list)
    """Prompt b's K/V go into this slot, from position 0."""
    prefill_prompts: list[list[int]] = field(default_factory=list)
    """The token ids of each prompt to prefill (causal attention within the prompt)."""
    prefill_starts: list[int] = field(default_factory=list)
    """Prompt b's first position (empty: every prompt starts at 0). Positions ``[0, start)`` of its slot
    already hold the KV of the tokens before it; the prompt attends to them and writes from ``start``."""

    def starts(self) -> list[int]:
        """Each prompt's first position."""
        return self.prefill_starts or [0] * len(self.prefill_prompts)


@dataclass(frozen=True)
class _Rows:
    """The per-row tensors of one step (decode rows, then prompt rows)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    write_slots: torch.Tensor
    cos: torch.Tensor  # [R, 1, D]
    sin: torch.Tensor  # [R, 1, D], signed for the roll form of rotate_half


@dataclass(frozen=True)
class _DecodeAttention:
    """How the decode rows attend in one step (``SlotKVForward.plan_split``)."""

    rows: int
    short: int  # every row attends over keys [0, short)
    mask: torch.Tensor
    long_rows: slice | torch.Tensor | None  # rows past ``short``, redone over [0, long_length)
    long_length: int
    long_mask: torch.Tensor | None


@dataclass(frozen=True)
class _PrefillAttention:
    """The layout of the prompt rows of one step."""

    slots: list[int]
    lens: list[int]
    starts: list[int]  # first row of each prompt
    causal: torch.Tensor  # [pmax, pmax] additive mask
    offsets: list[int]  # first position of each prompt in its slot (> 0: a reused prefix before it)
    masks: list[torch.Tensor]  # each prompt's additive mask [len, offset + len], built once per step
    padded: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """(slots, [B, pmax] row index with pads, index of the real rows) of the padded batch; None: prompt by prompt."""


@dataclass
class _Layer:
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv_w: list[torch.Tensor]  # fused [q;k;v] weight (one entry) or three separate weights
    qkv_b: list[torch.Tensor | None]
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    gu_w: list[torch.Tensor]  # fused [gate;up] or two separate
    down_w: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def check_supported(model: Any, max_seq_len: int) -> None:
    """Raise ``UnsupportedModelError`` unless ``SlotKVForward`` can run ``model`` exactly."""
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"LocalEngine runs Llama-family decoders {SUPPORTED_MODEL_TYPES}; got model_type={mtype!r}. "
            "Serve this model with SGLang and use RemoteEngine instead."
        )
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        raise UnsupportedModelError(f"{type(model).__name__} lacks model.layers / lm_head")
    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedModelError(f"hidden_act={act!r} is not supported (silu only)")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type in ("dynamic", "longrope"):
        raise UnsupportedModelError(f"rope_type={rope_type!r} depends on sequence length; not supported")
    window = getattr(cfg, "sliding_window", None)
    uses_window = getattr(cfg, "use_sliding_window", mtype == "mistral")
    layer_types = getattr(cfg, "layer_types", None) or []
    if (uses_window or "sliding_attention" in layer_types) and window is not None and window < max_seq_len:
        raise UnsupportedModelError(
            f"sliding_window={window} < max_seq_len={max_seq_len}: windowed attention is not implemented"
        )


class SlotKVForward:
    """Decoder forward with a slot KV cache (see module docstring)."""

    def __init__(self, model: Any, *, max_slots: int, max_seq_len: int, device: str | torch.device) -> None:
        check_supported(model, max_seq_len)
        cfg = model.config
        self.model = model
        self.device = torch.device(device)
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.groups = self.num_heads // self.num_kv_heads
        self.eps = float(cfg.rms_norm_eps)
        attn0 = model.model.layers[0].self_attn
        self.scale = float(getattr(attn0, "scaling", self.head_dim**-0.5))
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = model.lm_head.weight.shape[0]
        self.fuse = sum(p.numel() for p in model.parameters()) <= FUSE_MAX_PARAMS
        # One extra slot (index max_slots) is a write sink for the idle rows of a step.
        self.scratch = max_slots
        shape = (self.num_layers, max_slots + 1, self.num_kv_heads, max_seq_len, self.head_dim)
        check_kv_fits(
            layers=self.num_layers,
            slots=max_slots + 1,
            kv_heads=self.num_kv_heads,
            max_seq_len=max_seq_len,
            head_dim=self.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            pos = torch.arange(max_seq_len, device=self.device)[None]
            dummy = torch.zeros(1, dtype=self.dtype, device=self.device)
            cos, sin = model.model.rotary_emb(dummy, pos)
        half = self.head_dim // 2
        self.cos = cos[0].to(self.dtype).contiguous()  # [L, D]
        sin = sin[0].to(self.dtype)
        # rotate_half(x) * sin == roll(x, half) * cat(-sin1, sin2): same products, one op fewer.
        self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).contiguous()
        self.half = half
        self.arange_len = torch.arange(max_seq_len, device=self.device)
        self.split_min_keys = 48  # see plan_split
        self.max_batched_scores = 1 << 24  # padded prompt batches above this many scores go one by one
        self.refresh()

    # ----------------------------------------------------------------------------------- weights
    @torch.no_grad()
    def refresh(self) -> None:
        """(Re)read the weights from the model's parameters (call after any in-place update)."""
        m = self.model.model
        self.embed = m.embed_tokens.weight
        self.final_norm = m.norm.weight
        self.lm_head = self.model.lm_head.weight
        layers = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            ws = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
            bs = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
            gu = [mlp.gate_proj.weight, mlp.up_proj.weight]
            if self.fuse:
                ws = [torch.cat(ws, 0)]
                bs = [torch.cat(bs, 0)] if bs[0] is not None else [None]
                gu = [torch.cat(gu, 0)]
            layers.append(
                _Layer(
                    in_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    qkv_w=ws,
                    qkv_b=bs,
                    o_w=a.o_proj.weight,
                    o_b=a.o_proj.bias,
                    gu_w=gu,
                    down_w=mlp.down_proj.weight,
                    q_norm=a.q_norm.weight if hasattr(a, "q_norm") else None,
                    k_norm=a.k_norm.weight if hasattr(a, "k_norm") else None,
                )
            )
        self.layers = layers

    # ----------------------------------------------------------------------------------- helpers
    def _qkv(self, ly: _Layer, h: torch.Tensor, lora: LoraRows | None = None, li: int = 0) -> torch.Tensor:
        """Projected q|k|v as ``[..., heads + 2 * kv_heads, head_dim]`` (before norms/rotary)."""
        if len(ly.qkv_w) == 1:
            x = F.linear(h, ly.qkv_w[0], ly.qkv_b[0])
        else:
            x = torch.cat([F.linear(h, w, b) for w, b in zip(ly.qkv_w, ly.qkv_b, strict=True)], -1)
        if lora is not None:
            lora.add(x, h, (li, "qkv"))
        return x.view(*h.shape[:-1], self.num_heads + 2 * self.num_kv_heads, self.head_dim)

    def _rope_qk(self, ly: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Apply q/k norms (Qwen3) and rotary to the q and k heads of ``x``; returns (q, k, v)."""
        nq, nkv = self.num_heads, self.num_kv_heads
        if ly.q_norm is not None:
            q = F.rms_norm(x[..., :nq, :], (self.head_dim,), ly.q_norm, self.eps)
            k = F.rms_norm(x[..., nq : nq + nkv, :], (self.head_dim,), ly.k_norm, self.eps)
            qk = torch.cat([q, k], dim=-2)
        else:
            qk = x[..., : nq + nkv, :]
        qk = qk * cos + qk.roll(self.half, -1) * sin
        return qk[..., :nq, :], qk[..., nq:, :], x[..., nq + nkv :, :]

    def _mlp_block(self, ly: _Layer, x: torch.Tensor, lora: LoraRows | None = None, li: int = 0) -> torch.Tensor:
        h = F.rms_norm(x, (x.shape[-1],), ly.post_norm, self.eps)
        if lora is None:
            if len(ly.gu_w) == 1:
                gate, up = F.linear(h, ly.gu_w[0]).chunk(2, dim=-1)
            else:
                gate, up = F.linear(h, ly.gu_w[0]), F.linear(h, ly.gu_w[1])
            return x + F.linear(F.silu(gate) * up, ly.down_w)
        gu = F.linear(h, ly.gu_w[0]) if len(ly.gu_w) == 1 else torch.cat([F.linear(h, w) for w in ly.gu_w], -1)
        gate, up = lora.add(gu, h, (li, "gu")).chunk(2, dim=-1)
        act = F.silu(gate) * up
        return x + lora.add(F.linear(act, ly.down_w), act, (li, "down"))

    def _logits(self, x: torch.Tensor, lora: LoraRows | None = None) -> torch.Tensor:
        x = F.rms_norm(x, (x.shape[-1],), self.final_norm, self.eps)
        logits = F.linear(x, self.lm_head)
        return logits if lora is None else lora.add(logits, x, (-1, "lm_head"))

    # ----------------------------------------------------------------------------------- prefill
    def prefill(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Run the prompts (one per slot) from position 0; fill the slots' KV; return last logits [B, V]."""
        _, logits = self.step(ForwardBatch(prefill_slots=slots, prefill_prompts=prompts))
        assert logits is not None
        return logits

    @torch.no_grad()
    def copy_prefix(self, src: int, dsts: list[int], length: int) -> None:
        """Copy positions ``[0, length)`` of slot ``src``'s KV into each slot of ``dsts``."""
        if not dsts:
            return
        d = torch.as_tensor(dsts, dtype=torch.long, device=self.device)
        self.k_cache[:, d, :, :length] = self.k_cache[:, src : src + 1, :, :length]
        self.v_cache[:, d, :, :length] = self.v_cache[:, src : src + 1, :, :length]

    # ----------------------------------------------------------------------------------- step
    @torch.no_grad()
    def step(
        self, batch: ForwardBatch, lora: LoraRows | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One forward over the decode rows and the prompts of ``batch`` (see ``ForwardBatch``).

        Linear layers run once over all rows (prefill rides along with decode instead of a forward of its
        own); ``lora`` adds the adapters of the rows that run on one (rows numbered decode rows first, then
        the prompts' tokens). Returns (decode logits [rows, V] or None, logits after each prompt [B, V] or
        None)."""
        num_decode, lens = len(batch.decode_positions), [len(p) for p in batch.prefill_prompts]
        offsets = batch.starts()
        rows = self._rows(batch, lens, offsets)
        decode = self._decode_attention(batch.decode_positions, rows.positions[:num_decode]) if num_decode else None
        prefill = self._prefill_attention(batch.prefill_slots, lens, num_decode, offsets) if lens else None
        x = F.embedding(rows.tokens, self.embed)  # [R, H]
        for li, ly in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), ly.in_norm, self.eps)
            q, k, v = self._rope_qk(ly, self._qkv(ly, h, lora, li), rows.cos, rows.sin)  # q [R, H, D], k/v [R, KVH, D]
            k_cache, v_cache = self.k_cache[li], self.v_cache[li]
            k_cache[rows.write_slots, :, rows.positions] = k
            v_cache[rows.write_slots, :, rows.positions] = v
            q = q.reshape(q.shape[0], self.num_kv_heads, self.groups, self.head_dim)
            outs = []
            if decode is not None:
                outs.append(self._decode_rows_attention(decode, q, k_cache, v_cache))
            if prefill is not None:
                outs.extend(self._prompts_attention(prefill, q, k_cache, v_cache))
            o_all = outs[0] if len(outs) == 1 else torch.cat(outs, 0)
            o_out = F.linear(o_all, ly.o_w, ly.o_b)
            if lora is not None:
                lora.add(o_out, o_all, (li, "o"))
            x = x + o_out
            x = self._mlp_block(ly, x, lora, li)
        decode_logits = None
        if num_decode:
            decode_logits = self._logits(x[:num_decode], lora and lora.subset(slice(0, num_decode))).float()
        prompt_logits = None
        if prefill is not None:
            last = torch.tensor([st + n - 1 for st, n in zip(prefill.starts, lens, strict=True)], device=self.device)
            prompt_logits = self._logits(x[last], lora and lora.subset(last)).float()
        return decode_logits, prompt_logits

    def _rows(self, batch: ForwardBatch, lens: list[int], offsets: list[int]) -> _Rows:
        """The row tensors of a step: decode rows first, then every prompt's tokens."""
        dev = self.device
        prompt_positions = [t for n, start in zip(lens, offsets, strict=True) for t in range(start, start + n)]
        prompt_tokens = [t for p in batch.prefill_prompts for t in p]
        prompt_writes = [s for s, n in zip(batch.prefill_slots, lens, strict=True) for _ in range(n)]
        tokens = torch.tensor(batch.decode_tokens + prompt_tokens, dtype=torch.long, device=dev)
        positions = torch.tensor(batch.decode_positions + prompt_positions, dtype=torch.long, device=dev)
        write_slots = torch.tensor(batch.decode_write_slots + prompt_writes, dtype=torch.long, device=dev)
        cos = self.cos[positions][:, None, :]
        sin = self.sin_signed[positions][:, None, :]
        return _Rows(tokens, positions, write_slots, cos, sin)

    def _decode_attention(self, decode_positions: list[int], positions: torch.Tensor) -> _DecodeAttention:
        """The key ranges and masks of the decode rows (``plan_split``'s short/long split)."""
        short, long_rows = self.plan_split(decode_positions)
        mask = self._mask(positions, short)
        if not long_rows:
            return _DecodeAttention(len(decode_positions), short, mask, None, 0, None)
        length = max(decode_positions) + 1
        # consecutive long rows (often just one) are a slice (a view), others a gather
        lo, up = long_rows[0], long_rows[-1] + 1
        index = slice(lo, up) if up - lo == len(long_rows) else torch.as_tensor(long_rows, device=self.device)
        return _DecodeAttention(len(decode_positions), short, mask, index, length, self._mask(positions[index], length))

    def _prefill_attention(
        self, slots: list[int], lens: list[int], first_row: int, offsets: list[int]
    ) -> _PrefillAttention:
        """The layout of the prompt rows: one prompt at a time, or one padded ``[B, pmax]`` batch (only
        when every prompt starts at position 0)."""
        dev, count, pmax = self.device, len(lens), max(lens)
        starts = [first_row + sum(lens[:b]) for b in range(count)]
        causal = torch.full((pmax, pmax), float("-inf"), dtype=self.dtype, device=dev).triu_(1)
        # A padded batch materialises B x heads x P x P scores: above ~64 MiB go prompt by prompt.
        masks = [self._causal(causal, n, off) for n, off in zip(lens, offsets, strict=True)]
        if count == 1 or any(offsets) or count * pmax * pmax * self.num_heads > self.max_batched_scores:
            return _PrefillAttention(slots, lens, starts, causal, offsets, masks)
        slots_t = torch.as_tensor(slots, dtype=torch.long, device=dev)
        # padded [B, pmax] view of the prompt rows (pads point at any real row; their output is dropped)
        pad_index = torch.tensor(
            [[st + min(t, n - 1) for t in range(pmax)] for st, n in zip(starts, lens, strict=True)], device=dev
        )
        keep = torch.tensor([b * pmax + t for b, n in enumerate(lens) for t in range(n)], device=dev)
        return _PrefillAttention(slots, lens, starts, causal, offsets, masks, (slots_t, pad_index, keep))

    def _decode_rows_attention(
        self, decode: _DecodeAttention, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """Attention output [rows, H * D] of the decode rows over their own slots' cache."""
        n, short = decode.rows, decode.short
        qd = q[:n]
        o = self._attend_decode(qd, k_cache[:n, :, :short], v_cache[:n, :, :short], decode.mask)
        if decode.long_rows is not None:
            ix, length = decode.long_rows, decode.long_length
            o[ix] = self._attend_decode(qd[ix], k_cache[ix, :, :length], v_cache[ix, :, :length], decode.long_mask)
        return o.reshape(n, -1)

    def _prompts_attention(
        self, prefill: _PrefillAttention, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> list[torch.Tensor]:
        """Causal attention outputs [prompt rows, H * D] of the prompts over their slots' cache (one tensor
        per prompt, or one for the padded batch)."""
        if prefill.padded is None:  # one new prompt (the common case), or long ones: views, one at a time
            outs = []
            rows = zip(prefill.slots, prefill.lens, prefill.starts, prefill.offsets, prefill.masks, strict=True)
            for slot, plen, st, off, mask in rows:
                qp = q[st : st + plen].permute(1, 2, 0, 3)  # [KVH, G, P, D]
                kp = k_cache[slot, :, : off + plen].unsqueeze(1)  # [KVH, 1, off + P, D]
                vp = v_cache[slot, :, : off + plen].unsqueeze(1)
                op = self._attend(qp, kp, vp, mask)
                outs.append(op.permute(2, 0, 1, 3).reshape(plen, -1))
            return outs
        slots_t, pad_index, keep = prefill.padded
        pmax = prefill.causal.shape[0]
        qp = q[pad_index].permute(0, 2, 3, 1, 4)  # [B, KVH, G, P, D]
        kp = k_cache[slots_t, :, :pmax].unsqueeze(2)  # [B, KVH, 1, P, D]
        vp = v_cache[slots_t, :, :pmax].unsqueeze(2)
        op = self._attend(qp, kp, vp, prefill.causal)  # [B, KVH, G, P, D]
        return [op.permute(0, 3, 1, 2, 4).reshape(len(prefill.lens) * pmax, -1)[keep]]

    def _causal(self, causal: torch.Tensor, length: int, offset: int) -> torch.Tensor:
        """The additive mask [length, offset + length] of a prompt starting at ``offset``: row t sees keys
        ``<= offset + t`` (the reused prefix and the prompt so far)."""
        if not offset:
            return causal[:length, :length]
        full = torch.full((length, offset + length), float("-inf"), dtype=self.dtype, device=self.device)
        return full.triu_(offset + 1)

    # ----------------------------------------------------------------------------------- decode
    def plan_split(self, pos_list: list[int]) -> tuple[int, list[int]]:
        """Choose the attention split of a decode step: every slot attends over ``[0, short)`` in one
        batched matmul; the few slots past ``short`` (``long_rows``) redo their attention over their full
        length with gathered K/V. Long-tailed batches (a few long sequences among many short ones)
        then stop paying the longest length for every slot. Returns ``(length, [])`` for no split."""
        length = max(pos_list) + 1
        n = len(pos_list)
        if n < 8 or length < 2 * self.split_min_keys:
            return length, []
        k = max(1, n // 8)  # at most 1/8 of the slots take the long path
        short = -(-(sorted(pos_list)[-k - 1] + 1) // 16) * 16
        short = max(short, self.split_min_keys)
        if length - short < self.split_min_keys:
            return length, []
        return short, [i for i, p in enumerate(pos_list) if p >= short]

    def _mask(self, positions: torch.Tensor, length: int) -> torch.Tensor:
        """Additive mask [n, 1, 1, length]: 0 where key position <= the row's position, else -inf."""
        visible = self.arange_len[:length][None, :] <= positions[:, None]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~visible, float("-inf"))[:, None, None, :]

    def _attend_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Decode attention [n, KVH, G, D] over [n, KVH, L, D]: PyTorch's fused kernel (same math as
        ``_attend``, ~10-30 % faster on CPU for these small batched shapes)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2))
        return torch.matmul(torch.softmax(scores * self.scale + mask, dim=-1), v)
