"""Command line: `python -m harness <command>`; options are defined once in harness.cli.options."""
