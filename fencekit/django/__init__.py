"""Django integration: ``INSTALLED_APPS = [..., "fencekit.django"]`` (docs/django.md).

- :class:`Fence` in a model's ``Meta`` declares its fence; ``makemigrations`` writes the
  operations (:mod:`fencekit.django.operations`), their SQL frozen into the migration.
- ``with fencekit.fencing(token):`` fences what Django writes inside it, in
  ``transaction.atomic()`` and in autocommit, sync or async (:mod:`fencekit.django.runtime`).
- Rejections reach Django code as ``django.db.DatabaseError`` with fencekit's error as
  ``__cause__`` (Django wraps what the driver raises).
"""

from fencekit.django.fences import Fence

__all__ = ["Fence"]
