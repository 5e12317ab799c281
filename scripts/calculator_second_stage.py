"""A second warm-start stage for the calculator task: continue an existing policy on the config's demonstrations.

``asyncrl sft`` always builds the tiny model from scratch. This script instead loads a policy that already
learned the calculator (e.g. a warm start whose every demonstration calls the tool) and fine-tunes it further
on the demonstrations the config gives (``launch.warm_start.warm_start_examples``: the training problems, in
``agent.tool_format``, with ``sft.tool_call_fraction`` of them calling the tool and the rest answering
directly), for ``sft.steps`` steps at ``sft.lr``. With a fraction below 1 this makes a policy that knows how
to use the tool but seldom reaches for it (docs/agent.md, "Adoption"):

    python scripts/calculator_second_stage.py --config configs/calculator.yaml --from WS --output WS2 \
        --set task.calculator_max_digits=3 --set sft.tool_call_fraction=0.3 --set sft.steps=150 \
        --set sft.lr=1e-3 --set sft.warmup_steps=10

``--from`` is read, never written; ``--output`` gets the model, its tokenizer and ``warm_start.json`` (the
stage's loss, tokens and wall time, the policy it started from, and its CPU seconds).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))


def main() -> int:
    from asyncrl.config import load_config
    from asyncrl.launch.stages import configure_threads
    from asyncrl.launch.warm_start import fine_tune_in_place

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--from", dest="source", required=True, help="the policy directory to continue from")
    parser.add_argument("--output", required=True, help="a new directory for the continued policy")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    cfg = load_config(args.config, args.set)
    configure_threads(cfg)  # run.torch_threads, as asyncrl sft: more threads oversubscribe a loaded machine
    if cfg.task.name != "calculator":
        raise SystemExit("this script continues a calculator warm start (task.name=calculator)")
    out = Path(args.output)
    if out.exists():
        raise SystemExit(f"{out} exists: choose a new --output")
    t0 = time.perf_counter()
    shutil.copytree(args.source, out)
    stats = fine_tune_in_place(cfg, out)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "second_stage": stats,
        "from": str(args.source),
        "overrides": args.set,
        "wall_s": round(time.perf_counter() - t0, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "first_stage": json.loads((Path(args.source) / "warm_start.json").read_text()),
    }
    (out / "warm_start.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
