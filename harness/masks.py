"""Old import path of the mask specs (now harness.spec.masks), kept for code that imports harness.masks."""

from harness.spec.masks import *  # noqa: F401,F403
from harness.spec.masks import __all__  # noqa: F401
