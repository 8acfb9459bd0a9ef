"""Declare a fence on a SQLAlchemy ``Table`` or ORM class, next to the table's definition.

The declaration is a :class:`~fencekit.spec.FenceSpec`, kept in ``Table.info`` in its JSON form
(``FenceSpec.as_dict()``, as the registry stores it): plain data, so anything that copies or
renders ``Table.info`` (alembic's ``create_table`` does) still produces valid Python. alembic's
autogenerate (``fencekit.alembic_plugin``) compares it with the database. Nothing here talks to
a database or adds columns: the generator owns the fence column and the triggers, and the alembic
filters keep autogenerate from proposing to drop them.

    billing = Table("billing_summary", metadata, Column("account_id", Integer, primary_key=True))
    declare_fence(billing, scope="key", key=["account_id"])

    @fenced(scope="row")
    class Job(Base):
        __tablename__ = "jobs"
        ...

Tables without a schema are declared in ``public``; autogenerate resolves them to the
connection's default schema, so ``search_path`` setups work too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fencekit.errors import SpecError
from fencekit.spec import (
    DEFAULT_COLUMN,
    DEFAULT_SCHEMA,
    FenceSpec,
    Scope,
    TableName,
    check_shared_resources,
)

if TYPE_CHECKING:
    from sqlalchemy import MetaData, Table

__all__ = ["INFO_KEY", "declare_fence", "declared_fence", "declared_fences", "fenced"]

INFO_KEY = "fencekit.fence"
"""The ``Table.info`` key that holds a table's declared spec (``FenceSpec.as_dict()``)."""

_T = TypeVar("_T")


def _table_of(target: Any) -> Table:
    from sqlalchemy import Table

    if isinstance(target, Table):
        return target
    table = getattr(target, "__table__", None)
    if isinstance(table, Table):
        return table
    raise TypeError(
        f"declare a fence on a sqlalchemy Table or a mapped ORM class, not {target!r} "
        "(for a class, apply @fenced(...) above the class so that it is mapped first)"
    )


def declare_fence(
    target: Any,
    *,
    scope: Scope | str = Scope.ROW,
    key: Sequence[str] = (),
    resource: str | None = None,
    on_missing: str = "reject",
    on_equal: str = "accept",
    column: str = DEFAULT_COLUMN,
    lease_bound: bool = False,
    issuer: str | None = None,
) -> FenceSpec:
    """Declare how ``target`` (a ``Table`` or mapped class) is fenced; returns the spec.

    The options are the CLI's: row / key / table scope, a named ``resource`` shared by several
    tables, the ``on_missing`` and ``on_equal`` policies, the row-fence ``column``, lease-bound
    fences and the ``issuer``. Key columns must exist on the table and be NOT NULL.
    """
    table = _table_of(target)
    if isinstance(key, str):
        raise SpecError(f"key must be a list of column names, not the string {key!r}")
    for name in key:
        col = table.c.get(name)
        if col is None:
            raise SpecError(
                f"key column {name!r} is not a column of table {table.fullname!r} "
                f"(columns: {', '.join(c.name for c in table.columns)})"
            )
        if col.nullable:
            raise SpecError(
                f"key column {table.fullname}.{name} must be NOT NULL: a NULL key has no fence "
                "(declare it nullable=False or make it part of the primary key)"
            )
    spec = FenceSpec(
        table=TableName(table.schema or DEFAULT_SCHEMA, table.name),
        scope=Scope(scope),
        key=tuple(key),
        resource=resource,
        on_missing=on_missing,  # type: ignore[arg-type]  # FenceSpec validates the value
        on_equal=on_equal,  # type: ignore[arg-type]
        column=column,
        lease_bound=lease_bound,
        issuer=issuer,
    )
    table.info[INFO_KEY] = spec.as_dict()
    return spec


def fenced(**options: Any) -> Callable[[_T], _T]:
    """Class decorator form of :func:`declare_fence` for ORM classes."""

    def apply(cls: _T) -> _T:
        declare_fence(cls, **options)
        return cls

    return apply


def declared_fence(target: Any) -> FenceSpec | None:
    """The spec declared on a ``Table`` or mapped class, or None."""
    data = _table_of(target).info.get(INFO_KEY)
    return FenceSpec.from_dict(data) if data is not None else None


def declared_fences(metadata: MetaData | Iterable[MetaData]) -> Iterator[tuple[Table, FenceSpec]]:
    """Every (table, spec) pair declared in one or several ``MetaData`` collections."""
    from sqlalchemy import MetaData

    collections = [metadata] if isinstance(metadata, MetaData) else list(metadata)
    pairs = [
        (table, spec)
        for md in collections
        for table in md.tables.values()
        if (spec := declared_fence(table)) is not None
    ]
    check_shared_resources(spec for _, spec in pairs)
    yield from pairs
