"""``python -m meshplan``: the ``plan`` command."""

import sys

from meshplan.cli import console

sys.exit(console())
