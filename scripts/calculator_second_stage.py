"""A second warm-start stage for the calculator task, on an existing policy: continue it on the config's demonstrations.

``run_warm_start`` runs the second stage inside a fresh build (``sft.second_stage_steps``, docs/agent.md). This
script runs the same stage (``launch.warm_start.second_stage_config``: ``sft.second_stage_steps`` steps at
``sft.second_stage_lr`` on the training problems, ``sft.second_stage_tool_call_fraction`` of them calling the tool
and the rest answering directly) on a policy that already exists, e.g. a warm start built earlier whose every
demonstration calls the tool, so that one first stage can be continued at several fractions or lengths:

    python scripts/calculator_second_stage.py --config configs/calculator.yaml --from WS --output WS2 \
        --set task.calculator_max_digits=3 --set sft.second_stage_steps=150

(the fraction 0.3, lr 1e-3 and 10 warm-up steps are the defaults). ``--from`` is read, never written; ``--output``
gets the model, its tokenizer and ``warm_start.json`` (the stage's loss, tokens and wall time, the policy it started
from, and its CPU seconds). The probes of docs/results/record/agent-log.md "Adoption" ran an earlier form of this
script, which read the stage's settings from ``sft.steps``, ``sft.lr``, ``sft.warmup_steps`` and
``sft.tool_call_fraction``.
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
    from asyncrl.launch.warm_start import fine_tune_in_place, second_stage_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--from", dest="source", required=True, help="the policy directory to continue from")
    parser.add_argument("--output", required=True, help="a new directory for the continued policy")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    cfg = load_config(args.config, args.set)
    configure_threads(cfg)  # run.torch_threads, as asyncrl sft: more threads oversubscribe a loaded machine
    if cfg.task.name != "calculator" or not cfg.sft.second_stage_steps:
        raise SystemExit(
            "this script continues a calculator warm start (task.name=calculator) for sft.second_stage_steps > 0 steps"
        )
    out = Path(args.output)
    if out.exists():
        raise SystemExit(f"{out} exists: choose a new --output")
    t0 = time.perf_counter()
    shutil.copytree(args.source, out)
    stats = fine_tune_in_place(second_stage_config(cfg), out)
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
