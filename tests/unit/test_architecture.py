"""The package's folders are its layers: a module imports only from its own layer or the layers below it.

Order (lowest first): spec, oracle, backends, measure, store, execution, probes, compare, launch, advisor, report,
cli, suite (the two front ends: options are defined once in cli and fed to the pytest plugin too). The results
schema (harness.store.schema) is the shared vocabulary, importable from anywhere; top-level modules (the public
API, `__main__`, old import paths) may import anything.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "harness"
LAYERS = ("spec", "oracle", "backends", "measure", "store", "execution", "probes", "compare", "launch", "advisor",
          "report", "cli", "suite")
ANYWHERE = ("harness.store.schema",)


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
    assert top == {"harness", "harness.__main__", "harness.api", "harness.case", "harness.masks",
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
