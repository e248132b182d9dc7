"""The registry refuses to let a plugin take a name silently, and names what is allowed."""

import pytest

from harness.backends.base import Backend
from harness.backends.registry import all_backends, get_backends, register


def test_a_plugin_cannot_take_a_builtin_name_without_saying_so():
    class Impostor(Backend):
        name = "naive"

    with pytest.raises(ValueError, match="backend name 'naive' is taken by a built-in backend; .*replace=True"):
        register(Impostor)
    assert type(all_backends()["naive"]).__module__ == "harness.backends.naive"


def test_replace_true_replaces_and_the_same_class_may_register_again():
    original = type(all_backends()["sdpa-math"])

    class Mine(Backend):
        name = "sdpa-math"

    try:
        register(replace=True)(Mine)
        assert isinstance(all_backends()["sdpa-math"], Mine)
        register(Mine)  # its module imported again: the same class replaces itself
    finally:
        register(original, replace=True)
    assert type(all_backends()["sdpa-math"]) is original


def test_two_plugins_with_one_name_clash():
    class First(Backend):
        name = "clash-test"

    class Second(Backend):
        name = "clash-test"

    register(First)
    with pytest.raises(ValueError, match=r"taken by .*First"):
        register(Second)


@pytest.mark.parametrize("names, match", [(",", "no backend named"), ("", "no backend named"),
                                          ("nope", "unknown backend 'nope'; allowed: naive")])
def test_bad_backend_lists(names, match):
    with pytest.raises(ValueError, match=match):
        get_backends(names)


def _plugin(tmp_path, body: str) -> str:
    path = tmp_path / "my_plugin.py"
    path.write_text("import torch\nfrom harness import Backend, register\n@register\nclass Mine(Backend):\n"
                    "    name = 'load-check'\n" + body)
    return str(path)


@pytest.mark.parametrize("body, needle", [
    ("    def forward(self, q, k, v, *, mask):\n        return q\n",
     "forward(self, q, k, v, *, mask) must take scale as a keyword argument"),
    ("    def forward(self, q, k, v):\n        return q\n", "must take mask and scale as keyword arguments"),
    ("    def forward(self, q, *, mask, scale):\n        return q\n", "must take q, k, v positionally"),
    ("    dtypes = 'fp16'\n", "dtypes='fp16': must be None or a non-empty tuple of torch dtypes"),
    ("    dtypes = (torch.float16, 'bf16')\n", "must be None or a non-empty tuple of torch dtypes"),
    ("    devices = ('gpu',)\n", "devices=('gpu',): 'gpu' not allowed; allowed: cpu, cuda"),
    ("    max_head_dim = 0\n", "max_head_dim=0: must be None or an integer >= 1"),
    ("    supports_backward = 'yes'\n", "supports_backward='yes': must be True or False"),
    ("    relative_speed = {'cpu': 0}\n", "must be a dict of device type -> a number > 0"),
    ("    native_probes = frozenset({'causal', 'flash'})\n", "'flash' not allowed; allowed: causal, mask, dropout"),
    ("    layout = 'bsdh'\n", "layout='bsdh'; allowed: bhsd, bshd"),
])
def test_a_bad_declaration_is_one_line_naming_plugin_file_and_problem_when_it_loads(tmp_path, body, needle):
    from harness.isolation.plugin_host import load_backend_module

    path = _plugin(tmp_path, body)
    with pytest.raises(ValueError) as info:
        load_backend_module(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith("backend 'load-check' (Mine in ")
    assert path in message and needle in message
    assert "load-check" not in all_backends()  # nothing of it registered, so no case can run it


def test_a_good_declaration_loads_and_the_builtins_pass_their_own_check(tmp_path):
    from harness.backends.declaration import declaration_problems
    from harness.isolation.plugin_host import load_backend_module

    path = _plugin(tmp_path, "    dtypes = (torch.float32,)\n    devices = ('cpu',)\n"
                             "    def forward(self, q, k, v, *, mask, scale, **extra):\n        return q\n")
    from harness.backends.registry import _REGISTRY

    try:
        load_backend_module(path)
        assert "load-check" in all_backends()
    finally:
        _REGISTRY.pop("load-check", None)
    assert all(declaration_problems(type(b)) == [] for b in all_backends().values())


def test_an_unknown_name_is_told_what_the_loaded_modules_registered(tmp_path, monkeypatch):
    """A user who passed --backend-module and misspelled the name is told what that module registered, not to pass
    --backend-module (issue 48)."""
    from harness.backends import registry
    from harness.isolation import plugin_host

    monkeypatch.setattr(registry, "_LOADED", [])
    with pytest.raises(ValueError, match="known once its module is loaded: --backend-module my_attn.py"):
        get_backends("my-atn")
    path = tmp_path / "hint_plugin.py"
    path.write_text("from harness import Backend, register\n@register\nclass Hinted(Backend):\n"
                    "    name = 'hint-check'\n    def forward(self, q, k, v, *, mask, scale):\n        return q\n")
    empty = tmp_path / "empty_plugin.py"
    empty.write_text("")
    try:
        plugin_host.load_backend_module(str(path))
        plugin_host.load_backend_module(str(empty))
        with pytest.raises(ValueError) as refused:
            get_backends("hint-chek")
    finally:
        registry._REGISTRY.pop("hint-check", None)
    assert f"loaded: {path.resolve()} registered 'hint-check'; {empty.resolve()} registered no backend" in \
        str(refused.value)
