"""The lab: what proves fencekit and is not fencekit.

Launchers of real servers and clusters, the Patroni cluster, and the runs built on them. Nothing
here ships in the wheel, and no module under ``fencekit/`` imports it (a test checks). It
assumes a checkout: run its commands from the repository's root, e.g.
``python -m tests.lab ha --help``. See docs/dev/architecture.md, "The product and the lab".

- :mod:`tests.lab.ports`: free loopback ports (every launcher uses it).
- :mod:`tests.lab.postgres`: throwaway PostgreSQL clusters from Debian's or a release's
  binaries, crashable and restartable; :mod:`tests.lab.pgbouncer`: pgbouncer in front of one.
- :mod:`tests.lab.issuers`: etcd clusters and ZooKeeper ensembles.
- :mod:`tests.lab.clocks`: libfaketime clocks for workers and servers.
- :mod:`tests.lab.redis`: redis-server, the Celery and dramatiq broker of tests/tasks.
- :mod:`tests.lab.patroni`: two PostgreSQL nodes under Patroni with etcd, primary killed.
- :mod:`tests.lab.chaos`: the chaos run with the lab's faults (server crashes, pgbouncer
  paused, clocks, issuer nodes): ``python -m tests.lab chaos``.
- :mod:`tests.lab.chaos_ha`: the chaos run against the Patroni cluster (``python -m tests.lab ha``).
"""

import os

#: In CI (CI=true) a missing server or client library fails the tests that need it, never skips.
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
