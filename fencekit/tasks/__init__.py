"""Fenced tasks: a task body under a lease on its resource, its writes fenced (docs/tasks.md).

- :func:`fenced_task`: decorator or context manager; lease, claim at grant, ``fencing()``,
  renewal, a lost lease reported as :class:`~fencekit.leases.LeaseLostError`.
- :mod:`fencekit.tasks.procrastinate`: a procrastinate connector whose pooled connections
  carry the token.

Celery and dramatiq need no module: their recipes decorate the task function (docs/tasks.md).
"""

from fencekit.tasks.fenced import current_lease, fenced_task

__all__ = ["current_lease", "fenced_task"]
