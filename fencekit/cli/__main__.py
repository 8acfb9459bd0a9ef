"""``python -m fencekit.cli``: the same as the ``fencekit`` command."""

import sys

from fencekit.cli import main

sys.exit(main())
