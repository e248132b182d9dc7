"""What setup.sh installs for the optional backends, read from their declarations: `python -m harness.cli.node.setup_steps
[--gpu]` prints one line a backend, `NAME<TAB>install<TAB>pip arguments` or `NAME<TAB>skip<TAB>why`."""

from __future__ import annotations

import argparse
import sys


def steps(gpu: bool, torch_cuda: str | None) -> list[tuple[str, str, str]]:
    """(backend, 'install' or 'skip', the pip arguments space-separated or why not) for every built-in backend with a
    library of its own, on a machine with (`gpu`) or without a GPU beside a torch of CUDA `torch_cuda`."""
    from harness.backends.catalogue import installs, setup_step
    found = []
    for name, install in installs().items():
        step = setup_step(install, gpu, torch_cuda)
        found.append((name, "skip", step) if isinstance(step, str) else (name, "install", " ".join(step)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cli.node.setup_steps", description=__doc__)
    parser.add_argument("--gpu", action="store_true", help="the machine has a GPU (setup.sh asks nvidia-smi)")
    args = parser.parse_args(argv)
    import torch
    for line in steps(args.gpu, torch.version.cuda):
        print("\t".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
