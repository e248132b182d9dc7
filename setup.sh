#!/usr/bin/env bash
# Create .venv with everything the harness needs. Idempotent; safe to re-run.
#  - torch: a torch the calling python already has (system, conda, NGC image) is kept and stays visible in the
#    venv (--system-site-packages), with a flash_attn built for it; otherwise a GPU machine gets torch 2.10 with
#    CUDA 12.8 - the pair the xformers 0.0.35 wheel is built for - and a CPU-only one torch 2.13.0 (what CI uses).
#  - xformers is installed without dependencies so it can never replace your torch; whether its kernels can load
#    with the torch you have is said plainly at the end (python -m harness backends).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
XFORMERS=0.0.35
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    echo "setup.sh: keeping the torch of $PY ($("$PY" -c 'import torch; print(torch.__version__)')): the venv sees its site-packages"
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" 2>/dev/null; then
  if has_gpu; then
    # the torch xformers 0.0.35's extension was built against (its cpp_lib.json: 2.10.0+cu128)
    python -m pip install -q "torch==2.10.*" --index-url https://download.pytorch.org/whl/cu128 \
      || python -m pip install -q "torch==2.10.*"
  else
    python -m pip install -q "torch==2.13.0"
  fi
fi
python -m pip install -q -e ".[slurm]"   # submitit: the Slurm launcher, tested with its local executor
python -m pip install -q --no-deps "xformers==$XFORMERS" || echo "setup.sh: xformers not installed; its backend will report itself unavailable"
python -c "import torch, harness; print('setup.sh: torch', torch.__version__, '| cuda' if torch.cuda.is_available() else '| cpu only')"
python -m harness backends || true   # which backends can run here, and why not the others
if has_gpu && ! python -c "from harness.backends.xformers import load_problem; import sys; sys.exit(bool(load_problem()))" 2>/dev/null; then
  echo "setup.sh: xformers $XFORMERS cannot load its CUDA kernels with this torch: it is built for torch 2.10 + CUDA 12.8;"
  echo "          install the xformers wheel built for your torch (https://github.com/facebookresearch/xformers#installing-xformers)"
fi
