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
