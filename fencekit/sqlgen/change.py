"""The one fence-change model: a table's fence goes from spec ``old`` to spec ``new``.

``None`` on either side means "not protected", so protect, unprotect, a change of policies
and a move are one function, :func:`change_statements`, and its reverse is the same function
with the sides swapped. The alembic operations, the Django operations and ``fencekit move``
all call it; none decides on its own what a change means.

:class:`FenceChange` is that change as a migration records it: both specs and the statements
each way, frozen when the migration was written. A migration replays because it carries what
it installs, not because fencekit keeps its old templates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fencekit.errors import SpecError
from fencekit.spec import FenceSpec, TableName
from fencekit.sqlgen.move import is_move, move_statements
from fencekit.sqlgen.objects import TEMPLATE_VERSION
from fencekit.sqlgen.protect import protect_statements, unprotect_statements
from fencekit.sqlgen.script import DEFAULT_LOCK_TIMEOUT, _script, spec_comment

__all__ = ["FenceChange", "change_statements", "frozen_statements", "render_move"]


def change_statements(old: FenceSpec | None, new: FenceSpec | None) -> list[str]:
    """The current template's statements that take a table from fence ``old`` to fence
    ``new``, without transaction control.

    - ``None`` -> spec: protect;  spec -> ``None``: unprotect.
    - spec -> spec on the same table (policies, issuer, scope, key, resource or fence column;
      or the same spec, to re-protect with the current template): behind a lock on every
      writer and a guard that refuses (YF000) unless the registry holds exactly ``old``; a
      new issuer rebinds the resource, a new structure carries the fences
      (:mod:`fencekit.sqlgen.move`).
    """
    if old is None and new is None:
        raise SpecError("a fence change needs a spec on at least one side")
    if old is None:
        assert new is not None
        return protect_statements(new)
    if new is None:
        return unprotect_statements(old)
    return move_statements(old, new)


def render_move(old: FenceSpec, new: FenceSpec, *, lock_timeout: str = DEFAULT_LOCK_TIMEOUT) -> str:
    """The change from ``old`` to ``new`` as a reviewable psql script in one transaction, as
    ``fencekit move`` runs it and ``fencekit sql move`` prints it."""
    what = "move" if is_move(old, new) else "change the policies of"
    title = [
        f"fencekit: {what} {old.table.sql} ({old.scope} -> {new.scope} fence, "
        f"template {TEMPLATE_VERSION})",
        *spec_comment("from: ", old),
        *spec_comment("to:   ", new),
        "Writers of the table (and of tables sharing its resource) wait until it commits.",
    ]
    return _script(title, change_statements(old, new), lock_timeout)


def frozen_statements(sql: Iterable[str] | None, argument: str = "sql") -> tuple[str, ...] | None:
    """A migration's frozen statements as a tuple; ``None`` means "render when it runs"."""
    if sql is None:
        return None
    if isinstance(sql, (str, bytes)):
        # A string is an iterable of characters: refuse it rather than run one per character.
        raise TypeError(
            f"{argument}= takes a sequence of SQL statements (a tuple of strings), not one "
            "string: fencekit runs each statement as written and never splits a script"
        )
    statements = tuple(sql)
    for statement in statements:
        if not isinstance(statement, str):
            raise TypeError(f"{argument}= holds {statement!r}, not an SQL statement string")
    return statements


@dataclass(frozen=True, init=False)
class FenceChange:
    """A fence change as a migration records it: ``old`` -> ``new`` and the SQL each way.

    ``sql`` is what the change runs, ``undo_sql`` what its reverse runs; each is frozen when
    the migration is written, or ``None`` for an operation written by hand, which renders the
    current template when it runs.
    """

    old: FenceSpec | None
    new: FenceSpec | None
    sql: tuple[str, ...] | None
    undo_sql: tuple[str, ...] | None

    def __init__(
        self,
        old: FenceSpec | None,
        new: FenceSpec | None,
        sql: Iterable[str] | None = None,
        undo_sql: Iterable[str] | None = None,
        *,
        undo_argument: str = "undo_sql",
    ) -> None:
        if old is None and new is None:
            raise SpecError("a fence change needs a spec on at least one side")
        if old is not None and new is not None and old.table != new.table:
            raise SpecError(
                f"a fence change keeps the table ({old.table} -> {new.table}): move the fence "
                "of a renamed table with fencekit rename (or op.rename_fence)"
            )
        object.__setattr__(self, "old", old)
        object.__setattr__(self, "new", new)
        object.__setattr__(self, "sql", frozen_statements(sql))
        object.__setattr__(self, "undo_sql", frozen_statements(undo_sql, undo_argument))

    @classmethod
    def generate(cls, old: FenceSpec | None, new: FenceSpec | None) -> FenceChange:
        """The change as a migration writer records it: both ways rendered now."""
        return cls(old, new, change_statements(old, new), change_statements(new, old))

    @property
    def spec(self) -> FenceSpec:
        """The spec that names the table: ``new``, else ``old``."""
        spec = self.new if self.new is not None else self.old
        assert spec is not None
        return spec

    @property
    def table(self) -> TableName:
        return self.spec.table

    def statements(self) -> list[str]:
        """What the change runs: its frozen SQL, else the current template's."""
        if self.sql is not None:
            return list(self.sql)
        return change_statements(self.old, self.new)

    def reverse(self) -> FenceChange:
        return FenceChange(self.new, self.old, self.undo_sql, self.sql)

    def describe(self) -> str:
        """One line for a migration's log and its listing."""
        old, new = self.old, self.new
        origin = "current template" if self.sql is None else "frozen SQL"
        if old is None:
            assert new is not None
            return f"protect {new.table.sql} ({new.scope} fence, {origin})"
        if new is None:
            return f"unprotect {old.table.sql} ({old.scope} fence, {origin})"
        if is_move(old, new):
            return (
                f"move the fence of {new.table.sql} ({old.scope} -> {new.scope} fence, fences "
                f"carried, {origin})"
            )
        return f"change the fence of {new.table.sql} ({new.describe()}, fences kept, {origin})"
