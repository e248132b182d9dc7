"""The matrices registry (cases/matrices.REGISTRY): the one list of named matrices that options, build_matrix, the
probes' tier and the docs' matrix table read."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.cli.options import OPTIONS
from harness.cases.matrices import MATRICES, REGISTRY, Matrix, build_matrix, matrix
from harness.suite.probes import tier

DOCS = Path(__file__).resolve().parents[3] / "docs" / "timing.md"
FOR = {"cpu": "CPU", "cuda": "GPU"}


def _docs_table() -> list[list[str]]:
    """The rows of docs/timing.md's matrix table (the one whose header starts '| matrix |'), cells stripped."""
    lines = DOCS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| matrix |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_docs_matrix_table_lists_exactly_the_registry():
    rows = _docs_table()
    assert [re.fullmatch(r"`(.+)`", r[0]).group(1) for r in rows] == list(MATRICES)
    for name, device, cases, description, _runtime in rows:
        m = matrix(name.strip("`"))
        assert (device, description) == (FOR[m.device], m.description), name
        assert int(cases) == len(build_matrix(m.name)), f"{name}: the docs say {cases} cases"


def test_options_and_the_probes_tier_read_the_registry():
    help_text = OPTIONS["matrix"].help
    assert all(name in help_text for name in MATRICES) and "gpu on a CUDA device, default elsewhere" in help_text
    config = lambda name, shard=None: SimpleNamespace(_harness_matrix=name,  # noqa: E731
                                                       option=SimpleNamespace(shard=shard))
    assert {name: tier(config(name)) for name in MATRICES} == {
        "smoke": None, "default": "default", "full": "full", "gpu-smoke": None, "gpu": "default", "gpu-full": "full"}
    assert tier(config("model llama-3-8b")) == "default" and tier(config("default", "1/2")) is None


def test_a_matrix_entry_is_checked():
    with pytest.raises(ValueError, match="matrix 'x': device='tpu'"):
        Matrix("x", list, "tpu", "smoke", "")
    with pytest.raises(ValueError, match="runtime='nightly'"):
        Matrix("x", list, "cpu", "nightly", "")
    with pytest.raises(ValueError, match="unknown matrix 'huge'; allowed: smoke, default"):
        build_matrix("huge")
    assert set(REGISTRY) == set(MATRICES)


def test_smoke_has_rows_that_see_no_key_and_a_window_that_bites_in_fp32_and_bf16():
    """Issue 34: what defines a model is on the quick path, so a NaN on fully masked rows or a window off-by-one
    fails `check`."""
    from harness.cases.masks import SlidingWindow

    smoke = build_matrix("smoke")
    empty_rows = {str(c.dtype) for c in smoke if c.mask is not None
                  and not bool(c.key_mask().expand(c.batch, 1, c.seq_q, c.seq_k).any(-1).all())}
    biting = {str(c.dtype) for c in smoke if isinstance(c.mask, SlidingWindow)
              and int(c.key_mask().sum()) < c.seq_q * (c.seq_q + 1) // 2}  # fewer pairs than causal
    assert empty_rows == biting == {"torch.float32", "torch.bfloat16"}


def test_smoke_bites_off_the_tile_in_prefill_and_decode():
    """Issue 67 item 1: a kernel that lost its last partial block of keys past 128 passed `check` at 64 tokens."""
    tails = {c.seq_q == 1 for c in build_matrix("smoke")
             if c.seq_k > 128 and all(c.seq_k % tile for tile in (16, 32, 64, 128))}
    assert tails == {True, False}
