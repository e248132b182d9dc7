"""No traceback from stored data (issue 35 item 2): over results and samples files damaged at random - cut at any
byte, a cell replaced by any text, a column deleted (from the header, or from every line), lines dropped,
doubled or swapped, the file emptied - `load_results`, the report, `history` and `compare` answer with a result
or a one-line ValueError / FileNotFoundError (which the CLI prints as `error: ...`, exit 2), never another
exception. Property-based (hypothesis): the damage is drawn, and a failure is shrunk to the smallest damage."""

import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.history.stored import history_text, load_history
from harness.compare.report import summary, terminal_table
from harness.compare.runs import compare_runs
from harness.report.data import load_run
from harness.report.document import build_report, report_blocks, to_markdown
from harness.store.load import load_results, load_samples
from tests.fixtures.synthetic_run import write_run

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _clean_run(root: Path, name: str) -> Path:
    run = write_run(root / name, backends=("naive", "sdpa-flash"), seqs=(128, 256), dtypes=("fp32",),
                    masks=("none", "causal"))
    env = (run / "env.json").read_text().replace('"run_id"', '"testbed_id": "tb", "run_id"')
    (run / "env.json").write_text(env)
    return run


#: one damage to a file's text: what a killed writer, a bad edit or a bad copy leaves
_cut = st.tuples(st.just("cut"), st.floats(0, 1))
_cell = st.tuples(st.just("cell"), st.integers(0, 10 ** 6), st.integers(0, 10 ** 6),
                  st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
_column = st.tuples(st.just("column"), st.integers(0, 10 ** 6), st.booleans())
_lines = st.tuples(st.just(st.sampled_from(["drop", "double", "swap"])).flatmap(lambda s: s), st.integers(0, 10 ** 6))
_empty = st.tuples(st.just("empty"))
DAMAGE = st.lists(st.one_of(_cut, _cell, _column, _lines, _empty), min_size=1, max_size=3)


def damage(text: str, steps) -> str:
    for step in steps:
        lines = text.splitlines(keepends=True)
        kind = step[0]
        if kind == "cut":
            text = text[:int(step[1] * len(text))]
        elif kind == "empty":
            text = ""
        elif not lines:
            continue
        elif kind == "cell":
            i = step[1] % len(lines)
            cells = lines[i].rstrip("\r\n").split(",")
            cells[step[2] % len(cells)] = step[3]
            lines[i] = ",".join(cells) + "\n"
            text = "".join(lines)
        elif kind == "column":
            width = len(lines[0].split(","))
            j = step[1] % width
            keep = 1 if step[2] else len(lines)  # the header alone, or every line
            for i in range(min(keep, len(lines))):
                cells = lines[i].rstrip("\r\n").split(",")
                if j < len(cells):
                    del cells[j]
                lines[i] = ",".join(cells) + "\n"
            text = "".join(lines)
        else:
            i = step[1] % len(lines)
            if kind == "drop":
                del lines[i]
            elif kind == "double":
                lines.insert(i, lines[i])
            else:
                lines[i], lines[-1] = lines[-1], lines[i]
            text = "".join(lines)
    return text


def answers(call):
    """`call()`'s result, or None when it raised a one-line ValueError/FileNotFoundError; anything else fails."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    except (ValueError, FileNotFoundError) as exc:
        message = str(exc)
        assert message and "\n" not in message.strip(), f"a multi-line error: {message!r}"
        return None


class _Runs:
    """A clean base run and a damaged copy, in a fresh folder per example (hypothesis reruns the test body)."""

    def __init__(self, results_steps, samples_steps):
        self.root = Path(tempfile.mkdtemp(prefix="damaged-"))
        self.base = _clean_run(self.root / "runs", "a")
        self.new = self.root / "runs" / "b"
        shutil.copytree(self.base, self.new)
        for name, steps in (("results.csv", results_steps), ("samples.csv", samples_steps)):
            path = self.new / name
            path.write_bytes(damage(path.read_text(), steps).encode("utf-8", "surrogatepass"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.root, ignore_errors=True)


@SETTINGS
@given(results=DAMAGE, samples=DAMAGE)
def test_load_and_history_answer_every_damaged_file(results, samples):
    with _Runs(results, samples) as runs:
        df = answers(lambda: load_results(runs.new))
        if df is not None:
            assert set(df.phase.dropna()) <= {"fwd", "bwd", "fwd+bwd"}  # nothing unparsed got through
        answers(lambda: load_samples(runs.new))
        history = answers(lambda: load_history(runs.root / "runs"))
        assert history is not None  # a damaged run is skipped with a warning, the others still listed
        assert isinstance(answers(lambda: history_text(history)), str)


@SETTINGS
@given(results=DAMAGE, samples=DAMAGE)
def test_the_report_answers_every_damaged_file(results, samples):
    with _Runs(results, samples) as runs:
        run = answers(lambda: load_run(runs.new))
        if run is not None:
            assert isinstance(answers(lambda: to_markdown(report_blocks(run, {}), runs.new)), str)


@SETTINGS
@given(results=DAMAGE, samples=DAMAGE)
def test_compare_answers_every_damaged_file(results, samples):
    with _Runs(results, samples) as runs:
        for base, new in ((runs.base, runs.new), (runs.new, runs.base)):
            cmp = answers(lambda: compare_runs(base, new, use_noise_model=False))
            if cmp is not None:
                assert isinstance(terminal_table(cmp), str) and isinstance(summary(cmp), str)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(results=DAMAGE, samples=DAMAGE)
def test_the_whole_report_with_figures_answers_a_damaged_file(results, samples):
    """Fewer examples: each draws every figure."""
    with _Runs(results, samples) as runs:
        answers(lambda: build_report(runs.new))


def test_the_damage_is_real():
    """The strategies damage: a cut, a replaced cell and a deleted column each change the text."""
    text = "a,b,c\n1,2,3\n4,5,6\n"
    assert damage(text, [("cut", 0.5)]) == text[:9]
    assert damage(text, [("cell", 1, 1, "x")]) == "a,b,c\n1,x,3\n4,5,6\n"
    assert damage(text, [("column", 0, True)]) == "b,c\n1,2,3\n4,5,6\n"
    assert damage(text, [("column", 2, False)]) == "a,b\n1,2\n4,5\n"
    assert damage(text, [("empty",)]) == ""


pytestmark = pytest.mark.filterwarnings("ignore")
