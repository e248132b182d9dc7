"""Does precompiling a flex kernel's whole preamble (harness/backends/inductor_headers.py) change its machine code,
and what does it save? Cold cache, CPU.

    python benchmarks/flex_header_study.py [--matrix default] [--cases 0]

Two fresh processes, each with an empty TORCHINDUCTOR_CACHE_DIR, compile flex's forward on the same cases of the
matrix (the first --cases of those flex supports; 0: all), as the correctness stage does: one with inductor's own
precompiled header (cpp_prefix.h), one with the preamble hook. Inductor names a kernel's source by its code and
command line, not by the header, so the two caches hold the same file names: each pair of compiled kernels is
disassembled (objdump -d) and compared with addresses taken out. Prints the seconds of each process's first calls
and, per kernel, whether the code is identical; exits 1 if any kernel differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(matrix: str, cases: int, hook: bool) -> None:
    import torch

    from flex_compile_study import flex_forwards  # this directory: run as a script
    from harness.backends import inductor_headers

    if not hook:
        inductor_headers._installed.append(False)  # inductor's own header only
    seconds, ran = 0.0, 0
    for _, forward in flex_forwards(matrix):
        start = time.perf_counter()
        try:
            with torch.no_grad():
                forward()
        except Exception:  # an unsupported combination compiles nothing to compare
            continue
        seconds += time.perf_counter() - start
        ran += 1
        if ran == cases:
            break
    print(json.dumps({"cases": ran, "seconds": seconds}))


def disassembly(path: Path) -> str:
    """objdump -d of a kernel library, with addresses and offsets taken out (they move with the PLT's order)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(path)], capture_output=True,
                          text=True, check=True).stdout
    text = text.split("<kernel", 1)[-1]  # from the kernel's first symbol: the PLT before it lists imports
    text = re.sub(r"^\s*[0-9a-f]+:\s*", "", text, flags=re.M)
    text = re.sub(r"[0-9a-f]+ <([^>+]*)(\+0x[0-9a-f]+)?>", r"<\1>", text)
    return re.sub(r"0x[0-9a-f]+\(%rip\)", "RIP", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="default")
    parser.add_argument("--cases", type=int, default=0)
    parser.add_argument("--child", choices=("own", "preamble"))
    args = parser.parse_args()
    if args.child:
        return child(args.matrix, args.cases, args.child == "preamble")
    caches = {}
    for mode in ("own", "preamble"):
        caches[mode] = tempfile.mkdtemp(prefix=f"flex-header-{mode}-")
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=caches[mode])
        start = time.monotonic()
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--matrix", args.matrix, "--cases",
                               str(args.cases)], capture_output=True, text=True, env=env)
        if proc.returncode:
            raise SystemExit(proc.stderr[-3000:])
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{mode:9} header: {result['cases']} cases, first calls {result['seconds']:.1f} s "
              f"(process {time.monotonic() - start:.1f} s)", flush=True)
    kernels = {mode: {p.name: p for p in Path(d).rglob("*.main.so")} for mode, d in caches.items()}
    same = differ = 0
    for name in sorted(kernels["own"]):
        other = kernels["preamble"].get(name)
        if other is None:
            print(f"{name}: compiled with inductor's header only")
            continue
        equal = disassembly(kernels["own"][name]) == disassembly(other)
        same, differ = same + equal, differ + (not equal)
        print(f"{name}: {'identical' if equal else 'DIFFERS'}")
    print(f"machine code: {same} kernels identical, {differ} differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
