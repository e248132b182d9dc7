"""`python -m harness` entry point."""

import sys

from harness.cli.main import main

if __name__ == "__main__":  # a spawned worker imports this module as __mp_main__: it must not run the CLI again
    sys.exit(main())
