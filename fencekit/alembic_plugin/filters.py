"""Autogenerate filters: keep alembic away from objects fencekit owns.

Pass both to ``context.configure`` in ``env.py`` (the template does)::

    context.configure(..., include_name=include_name, include_object=include_object)

They hide the ``fencekit`` schema (its tables are the core's, not the application's) and the
reflected fence columns and ``fencekit``-named indexes/constraints that the generator adds to
protected tables. The comparator also prunes such proposals for fence columns with custom names,
so the filters are the first line, not the only one. To chain with your own filter::

    def include_object(obj, name, type_, reflected, compare_to):
        return fencekit_include_object(obj, name, type_, reflected, compare_to) and mine(...)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fencekit.spec import DEFAULT_COLUMN

__all__ = ["CORE_SCHEMA", "include_name", "include_object"]

CORE_SCHEMA = "fencekit"
#: How the comment protect puts on a row fence's column begins (fencekit.sqlgen.protect).
FENCE_COLUMN_COMMENT = "fencekit: the fence of this row"
_OWNED_PREFIX = "fencekit"


def include_name(name: str | None, type_: str, parent_names: Mapping[str, Any]) -> bool:
    """Skip the ``fencekit`` schema before alembic even reflects it (``include_schemas``)."""
    if type_ == "schema":
        return name != CORE_SCHEMA
    if type_ == "table":
        return parent_names.get("schema_name") != CORE_SCHEMA
    return True


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Skip fencekit's reflected objects that the metadata does not (and need not) declare."""
    if type_ == "table":
        return getattr(obj, "schema", None) != CORE_SCHEMA
    if not reflected or compare_to is not None or name is None:
        return True  # declared in the metadata: the application owns it
    if type_ == "column":
        # A fence column with a custom name (column=...) is recognised by the comment protect
        # gives every fence column: without this alembic logs "Detected removed column".
        comment = str(getattr(obj, "comment", None) or "")
        return name != DEFAULT_COLUMN and not comment.startswith(FENCE_COLUMN_COMMENT)
    return not name.startswith(_OWNED_PREFIX)
