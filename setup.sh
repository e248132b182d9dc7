#!/usr/bin/env bash
# Create .venv with everything the harness needs. Idempotent; safe to re-run.
#  - torch: kept if the environment already has one (bring your own CUDA build); otherwise a GPU
#    machine gets the default build, a CPU-only one torch 2.13.0 (the version CI uses).
#  - xformers is installed without dependencies so it can never replace your torch; its attn_bias
#    classes work everywhere, its kernels only where its binary matches your torch and CUDA.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q "torch>=2.5,<3"
  else
    python -m pip install -q "torch==2.13.0"
  fi
fi
python -m pip install -q -e ".[slurm]"   # submitit: the Slurm launcher, tested with its local executor
python -m pip install -q --no-deps "xformers==0.0.35" || echo "setup.sh: xformers not installed; its backend will report itself unavailable"
python -c "import torch, harness; print('setup.sh: torch', torch.__version__, '| cuda' if torch.cuda.is_available() else '| cpu only', '| backends:', ', '.join(harness.all_backends()))"
