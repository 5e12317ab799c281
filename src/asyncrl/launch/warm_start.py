"""The warm start: build the tiny default policy and fine-tune it on demonstrations, cached.

``ensure_policy(cfg)`` returns the model directory a run starts from: ``model.path`` when the
user gave one; otherwise ``<sft.cache_dir>/tiny-sft-<key>``, built (random-init tiny model +
``asyncrl sft`` on the task's demonstrations) the first time and reused afterwards. The key
hashes everything that changes the result (model shape, task, SFT settings), so a changed
setting never reuses a stale cache. The directory is written atomically (temp dir + rename).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

from asyncrl.config import Config
from asyncrl.data.prompts import build_task, render_prompt
from asyncrl.models import TinyModelSpec, build_tiny_policy, load_policy
from asyncrl.trainer.sft import sft_train


def warm_start_key(cfg: Config, spec: TinyModelSpec) -> str:
    payload = {
        "spec": spec.__dict__,
        "sft": cfg.sft.__dict__,
        "task": {k: v for k, v in cfg.task.__dict__.items() if k not in ("eval_size",)},
        "micro": cfg.trainer.max_tokens_per_micro_batch,
        "format": 3,  # 3: held-out and training split by question hash (data/synthetic.py)
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def run_warm_start(cfg: Config, out_dir: str | Path, spec: TinyModelSpec | None = None) -> dict[str, float]:
    """Build the tiny policy in ``out_dir`` and fine-tune it in place on the task's demonstrations."""
    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    build_tiny_policy(out, spec)
    model, tokenizer = load_policy(out, device=cfg.model.device)
    _, _, demos = build_task(cfg.task, tokenizer, teacher_slip_rate=cfg.sft.teacher_slip_rate)
    if not demos:
        raise ValueError(f"task {cfg.task.name!r} has no demonstrations for a warm start; pass --model DIR")
    eos = [tokenizer.eos_token_id]
    examples = [
        (render_prompt(tokenizer, q), tuple(tokenizer.encode(a, add_special_tokens=False)) + tuple(eos))
        for q, a in demos
    ]
    stats = sft_train(
        model,
        examples,
        cfg.sft,
        device=cfg.model.device,
        max_tokens_per_micro_batch=cfg.trainer.max_tokens_per_micro_batch,
        progress=cfg.run.progress,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / "warm_start.json").write_text(json.dumps(stats, indent=2))
    return stats


def ensure_policy(cfg: Config, spec: TinyModelSpec | None = None) -> Path:
    """The model directory to start RL from (built and cached on first use)."""
    if cfg.model.path:
        return Path(cfg.model.path)
    spec = spec or TinyModelSpec()
    cache = Path(cfg.sft.cache_dir)
    target = cache / f"tiny-sft-{warm_start_key(cfg, spec)}"
    if (target / "warm_start.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="building-", dir=cache))
    t0 = time.perf_counter()
    try:
        run_warm_start(cfg, tmp, spec)
        if target.exists():  # built concurrently by another run: keep theirs
            shutil.rmtree(tmp)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"warm start built in {time.perf_counter() - t0:.0f}s: {target}")
    return target
