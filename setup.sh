#!/usr/bin/env bash
# Create .venv with everything the harness needs. Idempotent; safe to re-run.
#   bash setup.sh                 from the package index
#   bash setup.sh --offline DIR   from a wheelhouse made by `python -m harness wheelhouse DIR` (no network)
#  - torch: a torch the calling python already has (system, conda, NGC image, or a venv of its own) is kept and
#    stays visible in the venv, with a flash_attn built for it; otherwise one is installed: torch 2.13.0 on a GPU
#    machine as on a CPU one (CI's). There is no pin to torch 2.10 + CUDA 12.8 any more: the xformers wheel (the
#    version its backend declares) is built on torch's stable ABI (CHANGELOG 0.0.34, setup.py -DTORCH_STABLE_ONLY), so
#    any torch >= 2.10 loads it; all it needs beside a torch of another CUDA is the CUDA 12 runtime its _C.so links (libcudart.so.12),
#    a ~3 MiB wheel installed below and loaded by the harness itself (harness/backends/xformers.py). One torch
#    version on both kinds of machine keeps their results comparable.
#  - the optional backends' libraries: what each backend declares (its `install`, harness/backends/<module>.py),
#    for the machine seen here (a GPU or not, the torch's CUDA), as harness/cli/node/setup_steps.py lists it: xformers and
#    FlashInfer without dependencies (they can never replace your torch), flash-attn-4 on a machine with a GPU only;
#    FlashAttention-2 and -3 build from source (docs/gpu.md). Whether each can run with the torch you have is said
#    plainly at the end (python -m harness backends). Offline: what the wheelhouse carried (--limit-mib).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
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
  python -c "from harness.cli.node.wheelhouse import report_unmet; raise SystemExit(report_unmet())"
else
  python -m pip install -q --upgrade pip >/dev/null
  if ! python -c "import torch" 2>/dev/null; then
    python -m pip install -q "torch==2.13.0"
  fi
  # the README's two commands: the main job (its report's history: [history]) and the tests ([test]: hypothesis,
  # and every extra they exercise - history, postgres, slurm's submitit with its local executor)
  python -m pip install -q -e ".[test]"
  # each backend's library as the registry declares it for this machine; with dependencies, the torch held where it
  # is by a constraint (--no-deps ones ignore it); one that fails to install reports itself unavailable below
  HOLD=$(mktemp); python -c "import torch; print(f'torch=={torch.__version__}')" >"$HOLD"
  STEPS=$(python -m harness.cli.node.setup_steps $(has_gpu && echo --gpu))
  while IFS=$'\t' read -r name what rest; do
    if [ "$what" = install ]; then
      read -r -a ARGS <<<"$rest"   # no globbing: 'flash-attn-4[cu13]==...' stays as it is
      python -m pip install -q -c "$HOLD" "${ARGS[@]}" || echo "setup.sh: $name not installed; its backend will report itself unavailable"
    else
      echo "setup.sh: $name $rest"
    fi
  done <<<"$STEPS"
  rm -f "$HOLD"
fi
python -c "import torch, harness; print('setup.sh: torch', torch.__version__, '| cuda' if torch.cuda.is_available() else '| cpu only')"
python -m harness backends || true   # which backends can run here, why not the others, and which kernels xformers calls
if has_gpu; then
  python -c "from harness.backends.xformers import load_problem; p = load_problem(); print('setup.sh: xformers:', p or 'its extension loads')" || true
fi
