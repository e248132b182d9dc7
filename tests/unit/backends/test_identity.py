"""A backend is its module: what the harness lists about backends (env.json's versions, the report, history, the
GPU acceptance run's error count, the figures' legends) comes from the registry, so a new backend module and its
one line in registry.BUILT_IN appear in every one of them with nothing else edited."""

import json
import sys
from importlib.metadata import version

import pandas as pd
import pytest
import torch

from harness.backends import registry
from harness.cli.node.selftest import _rows_summary
from harness.history.stored import load_run as history_run
from harness.report.data import load_run
from harness.report.document import environment_table
from harness.report.plots import FIGURE_BUILDERS, backend_style
from harness.store.environment import environment, library_versions
from harness.store.schema import BASELINE, ERROR, PASS
from tests.fixtures.synthetic_run import write_run

MODULE = "tests.fixtures.identity_backend"
NAME, KEY, LABEL = "fixture-attn", "pytest", "Fixture Attention"


@pytest.fixture
def backend(monkeypatch):
    """The fixture module registered as a built-in: the one line a new backend adds to registry.BUILT_IN."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.all_backends()))
    monkeypatch.setattr(registry, "BUILT_IN", (*registry.BUILT_IN, MODULE))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)  # registers itself again, into this registry
    yield registry.all_backends()[NAME]
    sys.modules.pop(MODULE, None)


@pytest.fixture
def run_dir(tmp_path, backend):
    """A stored run with the new backend's rows, env.json written by this process's environment()."""
    run_dir = write_run(tmp_path / "run", backends=(BASELINE, NAME), seqs=(128, 256), dtypes=("fp32",),
                        masks=("none",), semantics=False)
    env = json.loads((run_dir / "env.json").read_text())
    (run_dir / "env.json").write_text(json.dumps(env | library_versions()))
    return run_dir


def test_its_version_is_in_env_json_and_on_its_rows(backend):
    assert backend.version() == version("pytest") and type(backend).version_key() == KEY
    assert library_versions()[KEY] == version("pytest")
    assert environment(torch.device("cpu"))[KEY] == version("pytest")


def test_the_report_and_history_show_its_version(run_dir):
    table = dict(environment_table(load_run(run_dir)).itertuples(index=False))
    assert table[LABEL] == version("pytest")
    assert set(history_run(run_dir)[KEY]) == {version("pytest")}


def test_its_errors_count_as_harness_errors_in_the_acceptance_run(tmp_path, backend, monkeypatch):
    rows = pd.DataFrame({"backend": [NAME, NAME, BASELINE], "status": [ERROR, PASS, PASS]})
    (tmp_path / "run").mkdir()
    rows.to_csv(tmp_path / "run" / "results.csv", index=False)
    assert _rows_summary(tmp_path)[1] == 1
    monkeypatch.setattr(registry, "BUILT_IN", registry.BUILT_IN[:-1])  # a plugin's errors are the plugin's
    assert _rows_summary(tmp_path)[1] == 0


def test_the_figures_draw_it_in_its_colour_under_its_label(run_dir):
    assert backend_style(NAME) == ("#123456", "h")
    (_, fig), *_ = FIGURE_BUILDERS["latency"](load_run(run_dir))
    legend = {text.get_text(): handle for text, handle in zip(fig.legends[0].get_texts(),
                                                             fig.legends[0].legend_handles)}
    assert LABEL in legend and legend[LABEL].get_color() == "#123456" and legend[LABEL].get_marker() == "h"
