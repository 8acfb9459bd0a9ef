"""The lab: what proves fencekit and is not fencekit.

Launchers of real servers and clusters, the Patroni cluster, and the runs built on them. Nothing
here ships in the wheel, and no module under ``fencekit/`` imports it (a test checks). It
assumes a checkout: run its commands from the repository's root, e.g.
``python -m tests.lab ha --help``. See docs/dev/architecture.md, "The product and the lab".

- :mod:`tests.lab.patroni`: two PostgreSQL nodes under Patroni with etcd, primary killed.
- :mod:`tests.lab.chaos_ha`: the chaos run against that cluster (``python -m tests.lab ha``).
"""
