#!/usr/bin/env bash
# Create .venv with everything the harness needs. Idempotent; safe to re-run.
#   bash setup.sh                 from the package index
#   bash setup.sh --offline DIR   from a wheelhouse made by `python -m harness wheelhouse DIR` (no network)
#  - torch: a torch the calling python already has (system, conda, NGC image, or a venv of its own) is kept and
#    stays visible in the venv, with a flash_attn built for it; otherwise one is installed: torch 2.13.0 on a GPU
#    machine as on a CPU one (CI's). There is no pin to torch 2.10 + CUDA 12.8 any more: the xformers 0.0.35 wheel
#    is built on torch's stable ABI (CHANGELOG 0.0.34, setup.py -DTORCH_STABLE_ONLY), so any torch >= 2.10 loads
#    it; all it needs beside a torch of another CUDA is the CUDA 12 runtime its _C.so links (libcudart.so.12),
#    a ~3 MiB wheel installed below and loaded by the harness itself (harness/backends/xformers.py). One torch
#    version on both kinds of machine keeps their results comparable.
#  - xformers is installed without dependencies so it can never replace your torch; whether its kernels can load
#    with the torch you have is said plainly at the end (python -m harness backends).
#  - flash-attn-4 on a machine with a GPU only (see below); offline, where the wheelhouse carried it (--limit-mib).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
XFORMERS=0.0.35
FLASHINFER=0.6.1      # 7.6 MB; 0.7.x is ~62 MB (pip download --no-deps, docs/serving.md)
TVM_FFI=0.1.15.post2
CUDA12_RUNTIME=nvidia-cuda-runtime-cu12
OFFLINE=""
if [ "${1:-}" = "--offline" ]; then
  OFFLINE=$(cd "${2:?setup.sh --offline needs the wheelhouse directory}" && pwd)
  [ -f "$OFFLINE/manifest.json" ] || { echo "setup.sh: $OFFLINE has no manifest.json (make it with: python -m harness wheelhouse $2)"; exit 2; }
elif [ -n "${1:-}" ]; then
  echo "setup.sh: unknown argument '$1'; allowed: --offline DIR"; exit 2
fi
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    echo "setup.sh: keeping the torch of $PY ($("$PY" -c 'import torch; print(torch.__version__)')): the venv sees its site-packages"
    "$PY" -m venv --system-site-packages "$VENV"
    # --system-site-packages shows the base interpreter's packages only: when $PY is itself a venv, its own
    # site-packages (where its torch is) are added by a .pth file
    "$PY" - "$VENV" <<'EOF'
import pathlib, site, subprocess, sys
if sys.prefix != sys.base_prefix:
    target = subprocess.check_output([f"{sys.argv[1]}/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip()
    pathlib.Path(target, "_node_torch.pth").write_text("\n".join(site.getsitepackages()) + "\n")
EOF
  else
    "$PY" -m venv "$VENV"
  fi
fi
. "$VENV/bin/activate"
if [ -n "$OFFLINE" ]; then
  python -c "import torch" 2>/dev/null || { echo "setup.sh --offline: $PY has no torch and the wheelhouse carries none; run with PYTHON=<the node's python with torch>"; exit 1; }
  # every wheel without dependencies: pip then never re-resolves the node's torch (whose own requirements, e.g.
  # setuptools, a fresh venv may shadow); what the harness still lacks is listed right after
  python -m pip install -q --no-index --no-deps "$OFFLINE"/*.whl
  python -c "from harness.cli.wheelhouse import report_unmet; raise SystemExit(report_unmet())"
else
  python -m pip install -q --upgrade pip >/dev/null
  if ! python -c "import torch" 2>/dev/null; then
    python -m pip install -q "torch==2.13.0"
  fi
  python -m pip install -q -e ".[slurm]"   # submitit: the Slurm launcher, tested with its local executor
  python -m pip install -q --no-deps "xformers==$XFORMERS" || echo "setup.sh: xformers not installed; its backend will report itself unavailable"
  # FlashInfer's Python layer and what its import needs, without dependencies: its own pull in the CUTLASS DSL
  # (hundreds of MiB) that only its JIT on a GPU uses; on a CPU its wrappers import and their translation is tested
  python -m pip install -q --no-deps "flashinfer-python==$FLASHINFER" "apache-tvm-ffi==$TVM_FFI" einops tabulate \
    nvidia-ml-py tqdm click ninja requests urllib3 idna certifi charset-normalizer \
    || echo "setup.sh: flashinfer not installed; its backend will report itself unavailable"
  if has_gpu; then
    # FlashAttention-4 (CuTe DSL) with its dependencies - the CUTLASS DSL and its compiler for the torch's CUDA, ~90
    # MiB a flavour - and the torch held where it is by a constraint; not on a CPU machine (CI): nothing there runs
    # it, and its translation is tested with stand-ins (harness/cli/wheelhouse.py flash_attn_4_requirement decides)
    if FA4=$(python -c "from harness.cli.wheelhouse import print_flash_attn_4_requirement as p; raise SystemExit(p())"); then
      HOLD=$(mktemp); python -c "import torch; print(f'torch=={torch.__version__}')" >"$HOLD"
      python -m pip install -q -c "$HOLD" "$FA4" || echo "setup.sh: $FA4 not installed; its backend will report itself unavailable"
      rm -f "$HOLD"
    else
      echo "setup.sh: flash-attn-4 not installed: $FA4"
    fi
  fi
  if has_gpu && python -c "import sys, torch; sys.exit(torch.version.cuda is None or torch.version.cuda.startswith('12.'))"; then
    # a torch of another CUDA (13): xformers' _C.so needs libcudart.so.12, which that torch does not ship
    python -m pip install -q --no-deps "$CUDA12_RUNTIME" || echo "setup.sh: $CUDA12_RUNTIME not installed; xformers will say why it cannot load"
  fi
fi
python -c "import torch, harness; print('setup.sh: torch', torch.__version__, '| cuda' if torch.cuda.is_available() else '| cpu only')"
python -m harness backends || true   # which backends can run here, why not the others, and which kernels xformers calls
if has_gpu; then
  python -c "from harness.backends.xformers import load_problem; p = load_problem(); print('setup.sh: xformers:', p or 'its extension loads')" || true
fi
