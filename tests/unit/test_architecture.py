"""The package's folders are its layers: a module imports only from its own layer or the layers below it.

Order (lowest first): cases, oracle, backends, measure, store; then where code runs: calls (a call and what runs
beside the kernel in its worker), isolation (the processes), run (a session's stages), planning (the cost model),
fuzzing; then probes, history (the index of stored runs, noise, change points), compare, launch, advisor, report,
cli, suite (the two front ends: options are defined once in cli and fed to the pytest plugin too). The results
schema (harness.store.schema) is the shared vocabulary and harness.extras the optional dependencies' one-line
errors, importable from anywhere; top-level modules (the public API `harness.api`, `__main__`, and the public faces
`harness`, `harness.masks`, `harness.recommend`, which only re-export) may import anything. No layer imports a face:
user code has one path per thing (the face), the package's own code imports the module that defines it.
"""

import ast
from pathlib import Path

import pytest

from harness.store import schema

PACKAGE = Path(__file__).resolve().parents[2] / "harness"
LAYERS = ("cases", "oracle", "backends", "measure", "store", "calls", "isolation", "run", "planning", "fuzzing",
          "probes", "history", "compare", "launch", "advisor", "report", "cli", "suite")
ANYWHERE = ("harness.store.schema", "harness.extras")
#: top-level modules that only re-export what the layers define, for users
FACES = ("harness", "harness.masks", "harness.recommend")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        yield ".".join(p for p in parts if p != "__init__"), path


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "harness" or n.startswith("harness.")}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_every_module_sits_in_a_layer_folder_or_is_top_level_api():
    top = {m for m, p in _modules() if _layer(m) is None}
    assert top == {"harness", "harness.__main__", "harness.api", "harness.extras", "harness.masks",
                   "harness.recommend"}, top
    assert {_layer(m) for m, _ in _modules()} - {None} == set(LAYERS)


@pytest.mark.parametrize("module, path", list(_modules()), ids=lambda x: x if isinstance(x, str) else "")
def test_imports_flow_down_the_layers(module, path):
    mine = _layer(module)
    if mine is None:
        return
    upward = [name for name in _imports(path) if name not in ANYWHERE and _layer(name) is not None
              and LAYERS.index(_layer(name)) > LAYERS.index(mine)]
    assert not upward, f"{module} ({mine}) imports from higher layers: {upward}"
    faces = [name for name in _imports(path) if name in FACES]
    assert not faces, f"{module} ({mine}) imports a public face {faces}: import the module that defines the thing"


# --- no import cycle: every module of harness/ (spec/ included) can be understood before the ones importing it ---

#: cycles another branch removes; each entry is one cycle's modules, and a stale entry fails too
KNOWN_CYCLES: list[set[str]] = []


def _runtime_imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The harness modules a module's code imports, anywhere in it (a function's import runs too), resolving
    `from package import module`; an `if TYPE_CHECKING:` block runs no code, so it is left out."""
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
               and node.test.id == "TYPE_CHECKING" for n in ast.walk(node)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names & modules


def import_cycles(sources: dict[str, str]) -> list[set[str]]:
    """The import cycles among modules given as {dotted name: source}: each a set of modules that all reach each
    other through imports (Tarjan's strongly connected components of more than one module; a package naming itself,
    `from harness import masks` in harness/__init__.py, imports its submodule, not itself)."""
    modules = set(sources)
    graph = {m: sorted(_runtime_imports(ast.parse(src), modules) - {m}) for m, src in sources.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # recursive: the package's import depth is small
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_import_cycles_finds_a_planted_cycle_through_a_function_level_import():
    sources = {"harness.cases.a": "from harness.cases import b\n",
               "harness.cases.b": "def f():\n    from harness.cases.c import g\n",
               "harness.cases.c": "import harness.cases.a\n",
               "harness.cases.d": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness.cases.a import x\n",
               "harness.oracle.e": "from harness.cases.a import x\n"}
    assert import_cycles(sources) == [{"harness.cases.a", "harness.cases.b", "harness.cases.c"}]
    assert import_cycles({"harness.x": "import harness.y\n", "harness.y": "import harness.z\n",
                          "harness.z": ""}) == []


def test_no_import_cycle_in_the_package():
    cycles = import_cycles({module: path.read_text() for module, path in _modules()})
    unknown = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    stale = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not unknown, f"import cycles: {unknown}; move what both sides need into a module below them"
    assert not stale, f"KNOWN_CYCLES entries that are gone: {stale}"


def test_the_public_faces_export_every_mask_family_and_the_advisors_entry_points():
    """harness.masks is where users take mask specs from (README, docs/serving.md): a new family in cases/masks
    must be exported there too; harness.recommend is the advisor from Python."""
    import harness
    from harness import masks, recommend
    from harness.advisor import recommend as advisor
    from harness.cases import masks as spec_masks

    families = {name for name, obj in vars(spec_masks).items()
                if isinstance(obj, type) and issubclass(obj, spec_masks.MaskSpec)}
    assert families <= set(masks.__all__), families - set(masks.__all__)
    assert all(getattr(masks, name) is getattr(spec_masks, name) for name in masks.__all__)
    assert recommend.recommend is advisor.recommend and recommend.recommend_workload is advisor.recommend_workload
    assert harness.masks is masks and harness.recommend is recommend and set(harness.__all__) <= set(dir(harness))


# --- the vocabulary is spelled once: phases and statuses are harness.store.schema's names everywhere else ---

ROOT = PACKAGE.parent
SCHEMA = PACKAGE / "store" / "schema.py"
#: the words a row's phase, status or timing_status can take, and the gate's and the advisor's verdicts, as the
#: schema defines them
VOCABULARY = (frozenset(schema.PHASES) | frozenset(schema.STATUSES) | frozenset(schema.TIMING_STATUSES)
              | frozenset(schema.COMPARE_VERDICTS) | {schema.SAME, schema.WORSE, schema.LOST, schema.BETTER,
                                                     schema.TIED, schema.TIED_NOISY,
                                                     schema.TIED_UNCONFIRMED})
#: the same spelling in another sense: (file, word) -> (how many times, what it means there). The count is exact,
#: so a new literal of that word in the same file still fails, and an entry nobody needs any more fails too.
OTHER_SENSES = {
    ("harness/advisor/deploy_checks.py", "error"): (2, "a deployment check's answer (yes / no / error)"),
    ("harness/advisor/deploy_checks.py", "unsupported"): (1, "a mask path (MaskForm: native, dense, none, unsupported, "
                                                           "unknown), the mask_path column, not a row status"),
    ("harness/advisor/recommend.py", "error"): (4, "the deployment checks' answers when the backend's worker died"),
    ("harness/probes/batch_invariance.py", "error"): (1, "the batch_invariant check's answers (yes / no / error)"),
    ("harness/store/host.py", "unavailable"): (1, "where a device fact came from: nvml, nvidia-smi or neither"),
    ("harness/store/load.py", "observed"): (1, "the name of the `observed` column, read verbatim"),
}


def vocabulary_literals(source: str) -> list[tuple[int, str]]:
    """(line, word) of every string constant in `source` that is a phase or status word. Documentation (a string
    standing alone as a statement: docstrings) does not count, nor do comments (they are not in the tree)."""
    tree = ast.parse(source)
    docs = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    return sorted((node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant)
                  and isinstance(node.value, str) and node.value in VOCABULARY and id(node) not in docs)


def _code_files():
    for top in ("harness", "suites"):
        yield from (p for p in sorted((ROOT / top).rglob("*.py")) if p != SCHEMA)


def test_vocabulary_literals_finds_a_planted_phase_or_status_and_ignores_documentation():
    snippet = ('"""Compares with "pass"."""\n'
               'def f(row):\n'
               '    """Rows whose phase is "fwd"."""\n'
               '    # a comment naming "error"\n'
               '    return row.phase == "fwd" and row.status in ("pass", "oom")\n'
               'LABEL = "fwd pass"\n')
    assert vocabulary_literals(snippet) == [(5, "fwd"), (5, "oom"), (5, "pass")]
    assert vocabulary_literals("from harness.store.schema import FWD\nok = row.phase == FWD\n") == []


def test_vocabulary_literals_finds_a_planted_verdict_word_of_the_gate_or_the_advisor():
    snippet = ('def word(ratio, noisy):\n'
               '    """Says "slower" or "tied"."""\n'
               '    return "undecided" if noisy else ("slower" if ratio > 1 else "tied")\n')
    assert vocabulary_literals(snippet) == [(3, "slower"), (3, "tied"), (3, "undecided")]
    assert vocabulary_literals("from harness.store.schema import SLOWER\nbad = v == SLOWER\n") == []


def test_no_phase_or_status_literal_outside_the_schema():
    found: dict[tuple[str, str], list[int]] = {}
    for path in _code_files():
        for line, word in vocabulary_literals(path.read_text()):
            found.setdefault((path.relative_to(ROOT).as_posix(), word), []).append(line)
    wrong = [f"{file}:{lines} {word!r}" + (f" (allowed {OTHER_SENSES[file, word][0]}: {OTHER_SENSES[file, word][1]})"
                                           if (file, word) in OTHER_SENSES else "")
             for (file, word), lines in sorted(found.items())
             if len(lines) != OTHER_SENSES.get((file, word), (0, ""))[0]]
    stale = [f"{file} {word!r}" for file, word in OTHER_SENSES if (file, word) not in found]
    assert not wrong, "use harness.store.schema's names (PASS, FWD, NOT_TIMED, ...) instead of: " + "; ".join(wrong)
    assert not stale, f"OTHER_SENSES entries no file needs any more: {stale}"
