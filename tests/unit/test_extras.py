"""Dependencies where they are used (issue 64 item 6): the core installs what `pytest suites --benchmark`, `check`,
`recommend` and `compare` need; the history store, change points' compiled search, PostgreSQL and the tests' own
libraries come with extras, and a command needing a missing one says which, in one line."""

from pathlib import Path

import pytest
from packaging.requirements import Requirement

from harness.history import index_store
from harness.history.index import open_index
from harness.extras import EXTRAS, MissingExtra
from harness.report.document import history_section
from tests.fixtures.regress_fixtures import write_run

ROOT = Path(__file__).resolve().parents[2]
#: what a bare `pip install attention-harness` must not pull (numba brings llvmlite, 57 MiB)
NOT_CORE = {"numba", "llvmlite", "psycopg", "pyarrow", "hypothesis", "ruptures"}


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib (Python >= 3.11) reads pyproject.toml")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements) -> set[str]:
    return {Requirement(r).name for r in requirements}


def test_the_core_pulls_no_history_store_no_postgres_no_test_library_and_declares_packaging():
    core = _names(_project()["dependencies"])
    assert not core & NOT_CORE and "packaging" in core, core


def test_each_extra_named_in_messages_installs_its_modules():
    extras = _project()["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert set(modules) <= _names(extras[extra]), (extra, extras[extra])
    # the tests' extra installs every extra the tests exercise
    assert {"hypothesis", "attention-harness"} <= _names(extras["test"])
    assert {"history", "postgres", "slurm"} <= next(Requirement(r).extras for r in extras["test"]
                                                    if Requirement(r).name == "attention-harness")


def test_a_history_index_without_pyarrow_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(index_store, "pa", None)
    with pytest.raises(MissingExtra) as err:
        open_index(tmp_path).rows(("run_id",))
    text = str(err.value)
    assert "\n" not in text and "pyarrow" in text and "attention-harness[history]" in text, text


def test_a_report_without_pyarrow_says_why_it_has_no_history_section(tmp_path, monkeypatch):
    run = write_run(tmp_path / "runs" / "r1", {("c", "naive", "fwd"): {}})
    monkeypatch.setattr(index_store, "pa", None)
    blocks = history_section(run, {"testbed_id": "tb-cpu-a"}, tmp_path / "out")
    assert len(blocks) == 1 and "attention-harness[history]" in blocks[0].text, blocks


def test_slurm_without_submitit_names_its_extra_in_one_line(tmp_path, monkeypatch):
    import sys

    from harness.launch.slurm import submit

    monkeypatch.setitem(sys.modules, "submitit", None)  # an import of it fails as when it is not installed
    with pytest.raises(MissingExtra) as err:
        submit(["--matrix", "smoke"], 2, results_dir=tmp_path, cluster="local")
    assert "\n" not in str(err.value) and "attention-harness[slurm]" in str(err.value), err.value
