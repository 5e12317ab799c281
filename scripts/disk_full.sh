#!/usr/bin/env bash
# A training run on a filesystem that really fills up (issue 14 item 4), then resumed once space is
# freed. Needs root (it mounts a 64 MiB tmpfs); without root it says so and exits 0: the test suite
# covers the same paths by injecting ENOSPC (tests/controller/test_disk_full.py,
# tests/trainer/test_disk_full.py). About 1 minute on 2 busy CPU cores.
#
# Twice: a 10-step run (checkpoint every 2 steps) starts; once its step-2 checkpoint exists, a filler
# file takes all but LEAVE bytes of the filesystem: 200 KiB (a jsonl line fits, the step-4 checkpoint
# does not) and 0 (the next jsonl line fails). Checked: exit code 1 and the one-line disk-full message,
# every jsonl file made of complete lines, no partial checkpoint; after `rm filler`,
# `asyncrl train --resume` finishes the run and the ledger passes the no-loss checks.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${ASYNCRL_PYTHON:-$REPO/.venv/bin/python}"
if [ "$(id -u)" != 0 ]; then
    echo "disk_full.sh: needs root to mount a small tmpfs; skipped (the tests inject ENOSPC instead)"
    exit 0
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/asyncrl-disk-full.XXXXXX")"
DISK="$WORK/disk"
cleanup() { umount "$DISK" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$DISK"
mount -t tmpfs -o size=64m tmpfs "$DISK"
"$PY" -c "from asyncrl.models import build_tiny_policy; build_tiny_policy('$WORK/tiny')"
SETS=(model.path="$WORK/tiny" controller.max_staleness=2 controller.total_steps=10 controller.batch_size=4
      controller.max_concurrent=12 controller.checkpoint_every=2 rollout.group_size=4 rollout.max_new_tokens=24
      rollout.max_slots=32 eval.max_new_tokens=16 task.eval_size=4 task.train_size=300
      algo.filter_equal_rewards=false run.progress=false)
ARGS=()
for s in "${SETS[@]}"; do ARGS+=(--set "$s"); done

for LEAVE in 204800 0; do
    RUN="$DISK/run-$LEAVE"
    echo "=== leave $LEAVE bytes once the step-2 checkpoint exists"
    "$PY" -m asyncrl.cli train --run-dir "$RUN" "${ARGS[@]}" >"$WORK/out" 2>"$WORK/err" &
    PID=$!
    until [ -d "$RUN/checkpoints/step-00000002" ] || ! kill -0 "$PID" 2>/dev/null; do sleep 0.1; done
    FREE=$(df -B1 --output=avail "$DISK" | tail -1)
    fallocate -l $((FREE - LEAVE)) "$DISK/filler"
    RC=0; wait "$PID" || RC=$?
    echo "exit code $RC; stderr ends with:"; tail -1 "$WORK/err"
    [ "$RC" = 1 ] && tail -1 "$WORK/err" | grep -q "^asyncrl: disk full: writing .* asyncrl train --resume $RUN$"
    "$PY" - "$RUN" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
for name in ("metrics.jsonl", "trajectories.jsonl", "timeline.jsonl"):
    raw = (run / name).read_bytes()
    assert not raw or raw.endswith(b"\n"), f"{name}: torn last line"
    print(f"{name}: {len([json.loads(line) for line in raw.splitlines()])} complete lines")
names = sorted(p.name for p in (run / "checkpoints").iterdir())
assert all(not n.startswith(".") for n in names), names  # no temporary (half-written) checkpoint left
print("checkpoints:", names)
PY
    rm "$DISK/filler"
    "$PY" -m asyncrl.cli train --resume "$RUN" >"$WORK/out" 2>"$WORK/err" || { tail -20 "$WORK/err"; exit 1; }
    grep "^resuming" "$WORK/out"
    (cd "$REPO" && "$PY" -c "
from pathlib import Path
import json
from tests.invariants.test_no_loss_on_resume import check_ledger
print('ledger after resume:', check_ledger(Path('$RUN')), json.loads(Path('$RUN/summary.json').read_text())['steps'], 'steps')")
done
echo "disk_full.sh: ok"
