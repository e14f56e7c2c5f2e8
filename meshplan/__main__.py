"""``python -m meshplan``: the ``plan`` command."""

import sys

from meshplan.cli import main

sys.exit(main())
