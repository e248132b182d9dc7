"""`python -m harness backends`: every registered backend, whether it can run on this device, and why not."""

from __future__ import annotations

import argparse

from harness.cli.options import add_to_argparse


def _backends(args: argparse.Namespace) -> int:
    from harness.backends.registry import get_backends, load_backend_module
    from harness.execution.device import resolve_device
    from harness.execution.executor import make_executor
    for module in args.backend_module:
        load_backend_module(module)
    device = resolve_device(args.device)
    chosen = get_backends(args.backends)
    executor = make_executor()
    width = max(len(b.name) for b in chosen)
    print(f"backends on {device}:")
    missing = 0
    for backend in chosen:
        reason = executor.unavailable_reason(backend, device)
        missing += reason is not None
        state = "ok" if reason is None else "unavailable: " + reason
        print(f"  {backend.name:<{width}}  {backend.version():<14}  {state}")
        kernels = backend.kernels()
        if kernels:  # indented under the line: what the backend's ops call underneath
            print(f"  {'':<{width}}  kernels: {kernels}")
    return 0 if args.backends == "all" or not missing else 1


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("backends", help="list backends, their versions, and why any cannot run here "
                                               "(exit 1 when a named one cannot)")
    add_to_argparse(p, "backends", "backend_module", "device")
    p.set_defaults(func=_backends)
