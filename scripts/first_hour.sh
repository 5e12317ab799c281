#!/usr/bin/env bash
# The first hour of a new user (issue 14), the parts the test suite cannot check from inside the
# checkout. Run by .ci/run after `make test`; 72-86 s measured on 2 busy CPU cores. Needs the checkout's
# .venv (made by `make test`): its installed dependencies are reused, nothing is downloaded.
#
#  1. `git clone` into a directory only its owner can read (what `mktemp -d` makes, and what many
#     home directories are) whose path holds a space, then `make test` there (lint + the quick
#     tests that concern where a checkout sits) and `make run` (the tiniest settings).
#  2. The sandbox tests on a read-only source tree, run from another working directory.
#  3. `pip install .` (not editable) into a throwaway venv, then, from a directory that is not the
#     checkout, `asyncrl train` with the defaults (run directory and warm-start cache go under the
#     working directory), `asyncrl report`, a second `asyncrl train` into the same run directory
#     (refused, the old run byte-identical), and the code sandbox of the installed package.
#
# The throwaway venvs are made from the same base interpreter as .venv and see .venv's
# site-packages through a .pth file (`--system-site-packages` would show the base interpreter's,
# not .venv's); asyncrl itself is installed into them with `pip install --no-deps`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${ASYNCRL_PYTHON:-$REPO/.venv/bin/python}"
T0=$SECONDS
step() { printf '\n=== [%3ds] %s\n' "$((SECONDS - T0))" "$*"; }

"$PY" -c "import torch, transformers, pytest" || { echo "first_hour: run make test first ($PY lacks the dependencies)" >&2; exit 1; }
BASE="$("$PY" -c 'import sys; print(sys._base_executable)')"
DEPS="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/asyncrl first hour.XXXXXX")"
cleanup() { chmod -R u+w "$WORK" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
CLONE="$WORK/clone"

# A venv of BASE at $1 that imports .venv's packages; asyncrl goes in with pip install --no-deps $2...
venv_with_deps() {
  local dir="$1"; shift
  "$BASE" -m venv --without-pip "$dir"
  local site
  site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  printf '%s\n' "$DEPS" > "$site/_asyncrl_reused_deps.pth"
  "$dir/bin/python" -m pip install -q --no-deps --no-build-isolation --ignore-installed --no-cache-dir "$@"
}

step "1. clone into an owner-only directory whose path holds a space"
git clone -q "$REPO" "$CLONE"
stat -c '%A %n' "$WORK"
venv_with_deps "$CLONE/.venv" -e "$CLONE"   # what `make` installs, without downloading again
touch "$CLONE/.venv/.installed-stamp"
make -C "$CLONE" test PYTEST_ARGS="-p no:cacheprovider tests/reward/test_code_sandbox.py tests/test_first_hour.py tests/controller/test_rundir.py"

TINY=(--set controller.total_steps=2 --set controller.batch_size=2 --set controller.max_concurrent=4
      --set rollout.group_size=2 --set rollout.max_new_tokens=16 --set rollout.max_slots=8
      --set eval.max_new_tokens=16 --set task.eval_size=4 --set task.train_size=64
      --set sft.steps=2 --set sft.batch_size=8 --set sft.warmup_steps=0 --set run.progress=false)
step "1. make run in the clone (tiniest settings)"
make -C "$CLONE" run RUN_ARGS="${TINY[*]} --run-dir runs/first-hour"
test -s "$CLONE/runs/first-hour/summary.json"

step "2. the sandbox tests on a read-only source tree, from another working directory"
SANDBOX_TESTS=("$CLONE/.venv/bin/python" -m pytest -q -p no:cacheprovider "$CLONE/tests/reward/test_code_sandbox.py")
if [ "$(id -u)" = 0 ] && unshare --mount true 2>/dev/null; then
  # root ignores file modes: a read-only bind mount in a private mount namespace instead
  (cd "$WORK" && unshare --mount --propagation private bash -c \
    'mount --bind -o ro "$1" "$1" && ! touch "$1/probe" 2>/dev/null && shift && exec "$@"' _ "$CLONE" "${SANDBOX_TESTS[@]}")
elif [ "$(id -u)" = 0 ]; then
  # root without mount namespaces (e.g. a container without CAP_SYS_ADMIN) cannot make a tree it
  # cannot write: run the sandbox tests from another working directory only, and say so
  echo "first hour: root without 'unshare --mount': the read-only-tree check is skipped"
  (cd "$WORK" && "${SANDBOX_TESTS[@]}")
else
  chmod -R a-w "$CLONE"
  (cd "$WORK" && ! touch "$CLONE/probe" 2>/dev/null && "${SANDBOX_TESTS[@]}")
  chmod -R u+w "$CLONE"
fi

step "3. pip install . (not editable) into a throwaway venv"
venv_with_deps "$WORK/installed venv" "$CLONE"
ASYNCRL="$WORK/installed venv/bin/asyncrl"
mkdir "$WORK/elsewhere"
cd "$WORK/elsewhere"
"$WORK/installed venv/bin/python" - "$WORK/installed venv" <<'EOF'
import sys
import asyncrl
assert asyncrl.__file__.startswith(sys.argv[1]), f"asyncrl imported from {asyncrl.__file__}, not the install"
print("asyncrl imported from", asyncrl.__file__)
EOF

step "3. asyncrl train from another directory (defaults: runs/ and .cache/asyncrl under it)"
"$ASYNCRL" train "${TINY[@]}" | tail -3
RUN="$(ls -d runs/*/ | head -1)"
test -s "$RUN/summary.json" && test -s "$RUN/metrics.jsonl"

step "3. asyncrl report, then train into the same run directory: refused, old run byte-identical"
"$ASYNCRL" report "$RUN" | tail -1
BEFORE="$(cd "$RUN" && find . -type f -exec sha256sum {} + | sort)"
rc=0
"$ASYNCRL" train --run-dir "$RUN" "${TINY[@]}" 2> refused.txt || rc=$?
cat refused.txt
[ "$rc" = 2 ] && grep -q -- "--resume" refused.txt && grep -q -- "--overwrite" refused.txt
[ "$BEFORE" = "$(cd "$RUN" && find . -type f -exec sha256sum {} + | sort)" ] && echo "old run byte-identical"

step "3. the code sandbox of the installed package"
"$WORK/installed venv/bin/python" -c "
from asyncrl.reward.code import run_code_tests
ok = run_code_tests('def f():\n    return 1\n', 'assert f() == 1\n')
bad = run_code_tests('def f():\n    return 2\n', 'assert f() == 1\n')
assert ok.passed and bad.status == 'failed', (ok, bad)
print('sandbox from the installed package:', ok.isolation.get('mode'), ok.status, bad.status)"

step "first hour: all checks passed in $((SECONDS - T0))s"
