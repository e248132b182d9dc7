#!/usr/bin/env bash
# The GPU acceptance run for a node with no network, in one go within its own budget (BUDGET_S, default 540 s;
# the dry run's selftest gets 120 s):
#   scripts/gpu-acceptance.sh [--dry-run] [OUTDIR] [WHEELHOUSE]
# 1. installs every wheel of WHEELHOUSE (python -m harness wheelhouse DIR, made where the index is reachable) into
#    $SITE_DIR (default /tmp/gpu-acceptance-site) with --no-index --no-deps - the node's torch is never touched - and puts it on PYTHONPATH;
# 2. prints the environment into environment.txt (python, torch, its CUDA and cuDNN, the GPUs; nvidia-smi's and
#    nvcc's own output); which backends load, with their kernels and why any cannot, is the selftest's first step;
# 3. runs `python -m harness selftest --gpu --budget-s` with what is left of the budget.
# Leaves 6 files directly in OUTDIR (default gpu-acceptance): install.log, environment.txt, acceptance.log,
# selftest-table.txt, selftest.json, selftest.tgz (its work/ folder holds the steps' own logs and results, also inside
# selftest.tgz). --dry-run: the same on the CPU (no wheelhouse needed; CI).
set -uo pipefail
DRY=""
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-gpu-acceptance}
WHEELHOUSE=${2:-$ROOT/wheelhouse}
# the installed wheels stay out of OUTDIR, so that OUTDIR is only what a person reads afterwards
SITE=${SITE_DIR:-${TMPDIR:-/tmp}/gpu-acceptance-site}
PY=${PYTHON:-python3}
BUDGET=${BUDGET_S:-540}
START=$SECONDS
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/acceptance.log") 2>&1
echo "gpu-acceptance: budget $BUDGET s, out $OUT, wheelhouse $WHEELHOUSE${DRY:+ (dry run)}"

if [ -d "$WHEELHOUSE" ] && ls "$WHEELHOUSE"/*.whl >/dev/null 2>&1; then
  if "$PY" -m pip install --no-index --no-deps --upgrade --target "$SITE" "$WHEELHOUSE"/*.whl >"$OUT/install.log" 2>&1; then
    echo "installed $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels into $SITE"
  else
    echo "install from $WHEELHOUSE failed (see install.log); going on with what this python has"
  fi
  export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "no wheelhouse at $WHEELHOUSE: using what $PY has" >"$OUT/install.log"
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
cd "$ROOT"
{ timeout 60 "$PY" - <<'PY'
import platform, torch
gpus = [f"{torch.cuda.get_device_name(i)} sm{''.join(map(str, torch.cuda.get_device_capability(i)))}"
        for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else ["none visible to torch"]
print(f"python {platform.python_version()}; torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}); GPUs: {', '.join(gpus)}")
PY
  nvidia-smi 2>&1 || echo "nvidia-smi: none"; command -v nvcc >/dev/null && nvcc --version; } >"$OUT/environment.txt" 2>&1
head -1 "$OUT/environment.txt"

LEFT=$(( BUDGET - (SECONDS - START) - 10 ))   # 10 s for writing the archive at the end
if [ "$LEFT" -lt 1 ]; then LEFT=1; fi          # the selftest then lists every step as not run
# the dry run's selftest always gets 120 s: what CI pays for, whatever the steps before it took
STEP_BUDGET=$([ -n "$DRY" ] && echo 120 || echo "$LEFT")
"$PY" -m harness selftest --gpu ${DRY:+--dry-run} --budget-s "$STEP_BUDGET" --out "$OUT"
CODE=$?
echo "gpu-acceptance: selftest exit $CODE after $(( SECONDS - START )) s; table $OUT/selftest-table.txt"
exit $CODE
