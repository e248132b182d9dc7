"""Options are defined once and validated in one line naming the value, for the CLI and pytest alike."""

import argparse

import pytest

from harness.cli.main import main
from harness.cli.options import OPTIONS, add_to_argparse, call_timeout
from harness.isolation.supervisor import timeouts


@pytest.mark.parametrize("flag, value, message", [
    ("--timing-budget-ms", "nan", "must be a finite number > 0; got nan"),
    ("--timing-budget-ms", "0", "must be a finite number > 0; got 0"),
    ("--timing-budget-ms", "-5", "must be a finite number > 0; got -5"),
    ("--cpu-mem-budget-gb", "-1", "must be a finite number > 0; got -1"),
    ("--cpu-mem-budget-gb", "inf", "must be a finite number > 0; got inf"),
    ("--rounds", "0", "must be an integer >= 1; got 0"),
    ("--rounds", "two", "must be an integer >= 1; got 'two'"),
    ("--threads", "-2", "must be an integer >= 1; got -2"),
    ("--seed", "-1", "must be an integer >= 0; got -1"),
    ("--call-timeout-s", "0", "must be a finite number > 0; got 0"),
    ("--call-timeout-s", "bf16-*=nan", "must be a finite number > 0; got nan"),
])
def test_bad_numbers_are_refused_in_one_line(flag, value, message, capsys):
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_to_argparse(parser, *(name for name, o in OPTIONS.items() if o.flag == flag))
    with pytest.raises(argparse.ArgumentError, match=f"argument {flag}: {message}"):
        parser.parse_args([flag, value])


def test_the_cli_prints_one_line_and_exits_2(capsys):
    assert main(["compare", "a", "b", "--confidence", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m harness compare: error: argument --confidence: must be between 0 and 1 (exclusive), "
                   "e.g. 0.9; got 2"]


def test_call_timeouts_default_and_per_case():
    assert timeouts([]) == (300.0, ())
    assert timeouts([call_timeout("30"), call_timeout("bf16-*=900"), call_timeout("60")]) == (60.0,
                                                                                            (("bf16-*", 900.0),))


def test_every_option_is_defined_once():
    flags = [o.flag for o in OPTIONS.values()]
    assert len(flags) == len(set(flags))


def test_the_top_level_help_describes_the_tool(capsys):
    from harness.cli.main import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Check attention kernels" in out and "float64 reference" in out and "recommend" in out
    assert "parser" not in out and "one module per command" not in out


def _actions():
    """Every argument of every `python -m harness` command, with its command's name."""
    from harness.cli.main import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            yield name, action


def test_help_texts_read_their_defaults_never_repeat_them_by_hand():
    # argparse's %(default)s writes the value a flag really has; "(default: 300)" typed beside default=300 goes
    # stale when the constant moves (issue 22)
    stale = [f"{name} {a.option_strings or a.dest}: {a.help!r}" for name, a in _actions()
             if a.help and "default:" in a.help.lower() and a.default not in (None, False, [], argparse.SUPPRESS)
             and "%(default)" not in a.help]
    assert not stale, stale
    shown = {a.dest: a for name, a in _actions() if name == "recommend"}
    assert shown["timing_budget_ms"].default == 500.0 and "%(default)s" in shown["timing_budget_ms"].help
