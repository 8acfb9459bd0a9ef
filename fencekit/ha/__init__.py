"""fencekit on a highly available PostgreSQL: a real Patroni cluster on loopback.

:mod:`fencekit.ha.cluster` starts etcd and two PostgreSQL nodes under Patroni, kills the primary
the way a crashed machine goes, and lets the standby take over; the tests (tests/ha) and
``fencekit chaos --ha`` drive failovers through it. Nothing here is imported by ``fencekit``
itself: it is test and chaos infrastructure, not part of the fencing path.
"""
