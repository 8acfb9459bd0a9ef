"""A demo worker process: ``python -m fencekit.demo --worker A --dsn ...``."""

import sys

from fencekit.demo import worker_main

sys.exit(worker_main())
