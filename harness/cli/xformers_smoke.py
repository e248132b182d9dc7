"""`python -m harness xformers-smoke`: the environment, then xformers forward and backward against SDPA (no mask,
causal, a tensor bias) with the ops xformers chose - the first thing to read on a new GPU node.

Each case is checked against a float32 SDPA reference on the same (upcast) inputs: xformers' error must stay
within twice bf16 SDPA's own error plus 1e-3 (the kernels differ in accumulation order, not in what they compute).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import time

#: (batch, seq, heads, head_dim): a few ms a call on an H100-class GPU; bf16
SHAPE = (2, 1024, 8, 128)
MASKS = ("none", "causal", "tensor bias")


def environment() -> list[str]:
    """GPU, driver, python, torch and its CUDA, nvcc, and whether xformers' extension loads (and why not)."""
    import torch
    lines = [f"python {platform.python_version()}; torch {torch.__version__} (CUDA {torch.version.cuda}, "
             f"cuDNN {torch.backends.cudnn.version()})"]
    lines.append(f"GPU: {torch.cuda.get_device_name(0)} sm{''.join(map(str, torch.cuda.get_device_capability(0)))}"
                 f" x{torch.cuda.device_count()}" if torch.cuda.is_available() else "GPU: none visible to torch")
    for tool, args in (("nvidia-smi", ["--query-gpu=driver_version", "--format=csv,noheader"]),
                       ("nvcc", ["--version"])):
        if shutil.which(tool) is None:
            lines.append(f"{tool}: not on PATH")
            continue
        done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30)
        said = [line for line in done.stdout.strip().splitlines() if line.strip()]
        lines.append(f"{'driver' if tool == 'nvidia-smi' else 'nvcc'}: {said[-1] if said else done.stderr.strip()}")
    from harness.backends import xformers_library
    problem = xformers_library.load_problem()
    lines.append(f"xformers extension: {'loads' if problem is None else problem}")
    try:
        lines.append(f"xformers kernels: {xformers_library.xformers_kernels()}")
    except Exception as exc:  # not importable: the line above says why
        lines.append(f"xformers kernels: unknown ({type(exc).__name__})")
    return lines


def smoke(seconds: float) -> tuple[list[str], bool]:
    """Forward and backward of each mask on cuda:0, within `seconds`: (lines, all within tolerance)."""
    import torch
    import torch.nn.functional as F
    import xformers.ops as xops
    from xformers.ops import fmha
    b, s, h, d = SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    bias = torch.randn(b, h, s, s, device="cuda", dtype=torch.bfloat16, generator=gen)
    start, lines, ok = time.monotonic(), [], True
    for mask in MASKS:
        if time.monotonic() - start > seconds:
            lines.append(f"{mask}: not run ({seconds:.0f} s spent)")
            continue
        attn_bias = {"none": None, "causal": fmha.attn_bias.LowerTriangularMask(), "tensor bias": bias}[mask]
        inp = fmha.Inputs(query=q, key=k, value=v, attn_bias=attn_bias)
        fw = fmha.dispatch._dispatch_fw(inp, True)
        bw = fmha.dispatch._dispatch_bw(inp, varlen_lse_packed=None)
        dense = bias if mask == "tensor bias" else None

        def run(fn, dtype):
            leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
            out = fn(*leaves)
            out.backward(g.to(dtype))
            return [out.detach().float(), *(t.grad.float() for t in leaves)]

        def sdpa(qq, kk, vv):  # (B, S, H, D) -> SDPA's (B, H, S, D) and back
            mask_ = dense.to(qq.dtype) if dense is not None else None
            out = F.scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                                 attn_mask=mask_, is_causal=mask == "causal")
            return out.transpose(1, 2)

        ref = run(sdpa, torch.float32)
        ours = run(lambda qq, kk, vv: xops.memory_efficient_attention(qq, kk, vv, attn_bias=attn_bias, op=(fw, bw)),
                   torch.bfloat16)
        theirs = run(sdpa, torch.bfloat16)
        worst = []
        for name, r, x, t in zip(("out", "dq", "dk", "dv"), ref, ours, theirs):
            err_x, err_t = (x - r).abs().max().item(), (t - r).abs().max().item()
            fine = err_x <= 2 * err_t + 1e-3
            ok &= fine
            worst.append(f"{name} {err_x:.2e} (sdpa {err_t:.2e}){'' if fine else ' TOO FAR'}")
        lines.append(f"{mask}: fw {fw.NAME}, bw {bw.NAME}; max |err| vs fp32 SDPA: {', '.join(worst)}")
    return lines, ok


def _xformers_smoke(args: argparse.Namespace) -> int:
    import torch
    for line in environment():
        print(line)
    if args.dry_run or not torch.cuda.is_available():
        print("xformers smoke: not run (" + ("--dry-run" if args.dry_run else "no CUDA device") + ")")
        return 0
    from harness.backends.xformers_library import load_problem
    problem = load_problem()
    if problem is not None:
        print(f"xformers smoke: not run: {problem}")
        return 1
    lines, ok = smoke(args.seconds)
    print(f"xformers smoke {'x'.join(map(str, SHAPE))} (B, S, H, D) bf16, forward and backward:")
    print("\n".join("  " + line for line in lines))
    return 0 if ok else 1


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("xformers-smoke", help="environment + xformers fwd/bwd vs SDPA (no mask, causal, bias)",
                              description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--seconds", type=float, default=30.0, help="stop starting new cases after this. Default: "
                                                                 "%(default)s")
    p.add_argument("--dry-run", action="store_true", help="print the environment only (CPU)")
    p.set_defaults(func=_xformers_smoke)
