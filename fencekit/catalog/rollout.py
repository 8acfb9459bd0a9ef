"""Who still writes protected tables without a token: the rollout report and its verdict.

Tables protected with ``on_missing = allow`` attribute every statement that goes on without a
token to its writer (``fencekit.unfenced_writers``, 22_attribution.sql). This module reads
that back per table and decides whether the table is ready to enforce (``on_missing =
reject``): no tokenless write within a window the DBA chooses, observed for at least that
window, and no write reaching its rows where its checks do not see it (:func:`unseen_paths`).
The report's verdict is the gate: the CLI (``fencekit rollout``, ``fencekit enforce``), the
alembic operation and the Django operation all ask :func:`enforce_refusal`, which reads it,
before switching a table; none decides alone.

It reads fencekit's own tables, the catalogs and, when installed, pg_stat_statements' view
(by the schema its extension records, for the normalized text of a query id): nothing of a
table owner's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from fencekit.catalog.model import Action, Command, Drift, DriftKind
from fencekit.errors import CatalogError, SpecError
from fencekit.spec import FenceSpec, Scope, TableName

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[Any]

__all__ = [
    "DEFAULT_WINDOW",
    "DBAPIConnection",
    "TableRollout",
    "Writer",
    "enforce_check",
    "enforce_refusal",
    "enforced_spec",
    "parse_duration",
    "registered_spec",
    "rollout_report",
    "unseen_paths",
]

#: How long a table must have seen no tokenless write before it is ready to enforce, unless
#: the DBA chooses another window.
DEFAULT_WINDOW = timedelta(days=7)

_DURATION = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*(s|sec|min|m|h|d|w)?\s*$")
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
_LONGEST = timedelta(days=100 * 365)  # a window or a time beyond this is a typo


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30min``, ``12h``, ``7d``, ``2w`` (a bare number is seconds)."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration like 90s, 30min, 12h, 7d or 2w")
    seconds = float(m.group(1)) * _UNITS[(m.group(2) or "s").lower()]
    if seconds > _LONGEST.total_seconds():
        raise ValueError(f"{text!r} is longer than {_LONGEST.days // 365} years")
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class Writer:
    """One writer without a token: who, from where, which statement, when, how often."""

    session_user: str
    current_user: str
    application_name: str
    client_addr: str | None
    query_id: int | None
    fingerprint: str
    statement: str
    statement_source: str  # "pg_stat_statements", "fencekit" (literals replaced) or "literal"
    first_seen: datetime
    last_seen: datetime
    statements: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_user": self.session_user,
            "current_user": self.current_user,
            "application_name": self.application_name,
            "client_addr": self.client_addr,
            "query_id": self.query_id,
            "fingerprint": self.fingerprint,
            "statement": self.statement,
            "statement_source": self.statement_source,
            "first_seen": self.first_seen.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "statements": self.statements,
        }


@dataclass(frozen=True)
class TableRollout:
    """One protected table's rollout state at ``now``."""

    spec: FenceSpec
    observed_since: datetime
    attributed: bool  # its generated checks call fencekit.attribute
    writers: list[Writer]
    overflow_statements: int
    overflow_last_seen: datetime | None
    now: datetime
    window: timedelta
    lag: timedelta
    since: datetime | None = None
    shown: list[Writer] = field(default_factory=list)
    # Tokenless statements whose writer could not be recorded (its record was busy: another
    # session held its advisory lock, which any role can take; or the table's attribution log
    # was full), and the last time one was.
    unattributed_statements: int = 0
    unattributed_last_seen: datetime | None = None
    # Where writes reach the table's rows that its checks do not see (unseen_paths).
    unseen: list[Drift] = field(default_factory=list)

    @property
    def enforced(self) -> bool:
        return self.spec.on_missing == "reject"

    @property
    def blocking(self) -> list[Writer]:
        """Writers that wrote without a token inside the window (last_seen lags by up to
        ``lag``: a backend records a statement it recorded recently only by counting it)."""
        start = self.now - self.window
        return [w for w in self.writers if w.last_seen + self.lag > start]

    @property
    def overflow_blocking(self) -> bool:
        start = self.now - self.window
        return self.overflow_last_seen is not None and self.overflow_last_seen + self.lag > start

    @property
    def unattributed_blocking(self) -> bool:
        """Tokenless statements inside the window that no writer explains."""
        start = self.now - self.window
        return self.unattributed_last_seen is not None and self.unattributed_last_seen > start

    @property
    def verdict(self) -> str:
        """``enforced``, ``uncovered`` (writes reach its rows where its checks do not see them:
        :func:`unseen_paths`), ``not_attributed`` (protected before attribution: protect
        again), ``not_ready`` (writers to fix), ``too_early`` (observed for less than the
        window) or ``ready``. The first that holds: what to fix first."""
        if self.enforced:
            return "enforced"
        if self.unseen:
            return "uncovered"
        if not self.attributed:
            return "not_attributed"
        if self.blocking or self.overflow_blocking or self.unattributed_blocking:
            return "not_ready"
        if self.observed_since > self.now - self.window:
            return "too_early"
        return "ready"

    @property
    def ready_at(self) -> datetime | None:
        """When the table becomes ready if nobody writes without a token until then."""
        if self.verdict not in ("too_early", "not_ready"):
            return None
        last = [w.last_seen + self.lag for w in self.writers]
        if self.overflow_last_seen is not None:
            last.append(self.overflow_last_seen + self.lag)
        if self.unattributed_last_seen is not None:
            last.append(self.unattributed_last_seen)
        return max([self.observed_since, *last]) + self.window

    def as_dict(self, render: Callable[[Command], str]) -> dict[str, Any]:
        """The report's entry as JSON; ``render`` writes out a fix's command."""
        return {
            "table": self.spec.table.dotted,
            "schema": self.spec.table.schema,
            "name": self.spec.table.name,
            "spec": self.spec.as_dict(),
            "on_missing": self.spec.on_missing,
            "observed_since": self.observed_since.isoformat(),
            "verdict": self.verdict,
            "ready_at": self.ready_at.isoformat() if self.ready_at else None,
            "writers": [w.as_dict() for w in self.shown],
            "writers_total": len(self.writers),
            "blocking_writers": len(self.blocking),
            "overflow": {
                "statements": self.overflow_statements,
                "last_seen": self.overflow_last_seen.isoformat()
                if self.overflow_last_seen
                else None,
            },
            "unattributed": {
                "statements": self.unattributed_statements,
                "last_seen": self.unattributed_last_seen.isoformat()
                if self.unattributed_last_seen
                else None,
            },
            "uncovered": [d.as_dict(render) for d in self.unseen],
        }

    @property
    def refusal(self) -> str | None:
        """Why the table must not switch to ``on_missing = reject`` yet, from its verdict
        (None: go ahead)."""
        table, window = self.spec.table, self.window
        if self.verdict in ("ready", "enforced"):
            return None
        if self.verdict == "uncovered":
            return _unseen_refusal(table, self.unseen)
        if self.verdict == "too_early":
            return _too_early(table, self.observed_since, window, self.ready_at)
        if self.verdict == "not_attributed":
            return _NOT_ATTRIBUTED.format(table=table)
        who = [
            f"{w.current_user}"
            + (f" (login {w.session_user})" if w.session_user != w.current_user else "")
            + f", application_name {w.application_name!r}"
            + (f", from {w.client_addr}" if w.client_addr else "")
            + f", last {w.last_seen:%Y-%m-%d %H:%M:%S%z}: {w.statement}"
            for w in self.blocking
        ]
        if self.overflow_blocking:
            who.append(f"{self.overflow_statements} statements of writers beyond the cap")
        if self.unattributed_blocking and self.unattributed_last_seen is not None:
            who.append(
                _unattributed_line(self.unattributed_statements, self.unattributed_last_seen)
            )
        return (
            f"{table} was written without a token within the last {_human(window)} by "
            f"{len(self.blocking)} writer(s), which enforcing would break: " + "; ".join(who)
        )


def enforced_spec(spec: FenceSpec) -> FenceSpec:
    """``spec`` with ``on_missing = reject``: a policy, changed in place by protect."""
    d = spec.as_dict()
    d["on_missing"] = "reject"
    return FenceSpec.from_dict(d)


def _pgss_schema(conn: Conn) -> str | None:
    """The schema of pg_stat_statements' view when the extension is installed and the view is
    its member, owned by a superuser (so reading it runs nobody's code but PostgreSQL's)."""
    row = conn.execute(
        "SELECT n.nspname FROM pg_catalog.pg_extension e"
        " JOIN pg_catalog.pg_depend d"
        "  ON d.refclassid OPERATOR(pg_catalog.=)"
        "     'pg_catalog.pg_extension'::pg_catalog.regclass::pg_catalog.oid"
        "  AND d.refobjid OPERATOR(pg_catalog.=) e.oid"
        "  AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog.\"char\""
        "  AND d.classid OPERATOR(pg_catalog.=)"
        "     'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid"
        " JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid"
        " JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
        " JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.relowner"
        " WHERE e.extname OPERATOR(pg_catalog.=) 'pg_stat_statements'"
        "   AND c.relname OPERATOR(pg_catalog.=) 'pg_stat_statements' AND r.rolsuper"
    ).fetchone()
    return str(row[0]) if row else None


def _pgss_texts(conn: Conn, ids: list[int]) -> dict[int, str]:
    if not ids:
        return {}
    schema = _pgss_schema(conn)
    if schema is None:
        return {}
    from fencekit.ident import quote_ident

    try:
        rows = conn.execute(
            "SELECT DISTINCT ON (s.queryid) s.queryid, s.query"
            f" FROM {quote_ident(schema)}.pg_stat_statements s"
            " WHERE s.queryid OPERATOR(pg_catalog.=) ANY (%s)",
            [ids],
        ).fetchall()
    except Exception:  # no rights to read it: fencekit's own text is shown
        return {}
    return {int(q): str(t) for q, t in rows if t}


_NOT_ATTRIBUTED = (
    "{table}'s checks do not record who writes without a token (protected before "
    "attribution): protect it again in rollout mode and watch it for the window"
)


def _attributed_table(conn: Conn, table: TableName) -> bool:
    row = conn.execute(
        "SELECT p.tag, p.spec OPERATOR(pg_catalog.->>) 'on_missing'::pg_catalog.text"
        " FROM fencekit.protected p"
        " WHERE p.schema_name OPERATOR(pg_catalog.=) %s"
        "   AND p.table_name OPERATOR(pg_catalog.=) %s",
        [table.schema, table.name],
    ).fetchone()
    return row is None or row[1] != "allow" or _attributed(conn, str(row[0]))


def _attributed(conn: Conn, tag: str) -> bool:
    row = conn.execute(
        "SELECT pg_catalog.bool_or(pg_catalog.strpos(p.prosrc, 'fencekit.attribute(')"
        " OPERATOR(pg_catalog.>) 0)"
        " FROM pg_catalog.pg_proc p"
        " WHERE p.pronamespace OPERATOR(pg_catalog.=) 'fencekit'::pg_catalog.regnamespace"
        # The exact names: another table's tag may begin with this one's.
        "   AND p.proname::pg_catalog.text OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])",
        [[f"{tag}_{suffix}" for suffix in ("stmt", "trunc", "ins", "upd", "del")]],
    ).fetchone()
    return bool(row and row[0])


def rollout_report(
    conn: Conn,
    tables: list[TableName] | None = None,
    *,
    window: timedelta = DEFAULT_WINDOW,
    since: datetime | None = None,
) -> list[TableRollout]:
    """Per protected table (every one in rollout mode, or the ``tables`` named, whatever
    their mode): its writers without a token and the verdict. ``since`` limits the writers
    shown (not the verdict) to those seen since then. Needs to read
    ``fencekit.unfenced_writers``: fencekit_admin."""
    readable = conn.execute(
        "SELECT pg_catalog.has_table_privilege('fencekit.unfenced_writers', 'SELECT')"
        " AND pg_catalog.has_function_privilege('fencekit.fold_unfenced_log(text[])',"
        " 'EXECUTE')"
    ).fetchone()
    if not (readable and readable[0]):
        raise CatalogError(
            "reading who writes without a token needs fencekit_admin (the statements and "
            "client addresses are the application's): GRANT fencekit_admin TO <you>"
        )
    registry = conn.execute(
        "SELECT p.schema_name, p.table_name, p.tag, p.spec::pg_catalog.text, p.protected_at"
        " FROM fencekit.protected p ORDER BY p.schema_name, p.table_name"
    ).fetchall()
    wanted = {(t.schema, t.name) for t in tables} if tables is not None else None
    # What transactions at REPEATABLE READ or SERIALIZABLE recorded waits in a log until a
    # fold moves it into the writers' table (22_attribution.sql): the tables named, or all.
    tags = None if wanted is None else [r[2] for r in registry if (r[0], r[1]) in wanted]
    folded = conn.execute("SELECT fencekit.fold_unfenced_log(%s::pg_catalog.text[])", [tags])
    if not (folded.fetchone() or (False,))[0]:
        raise CatalogError(
            "reading who writes without a token folds fencekit.unfenced_log first, which "
            "needs a read-write transaction at READ COMMITTED (at SERIALIZABLE the fold would "
            "take part in every writer's serialization conflicts, and at REPEATABLE READ a "
            "writer recorded after its snapshot would fail it): run it at READ COMMITTED, on "
            "the primary"
        )
    now, lag = conn.execute(
        "SELECT pg_catalog.statement_timestamp(), fencekit.attribution_lag()"
    ).fetchone() or (None, 0)
    rows = conn.execute(
        "SELECT u.tag, u.session_user_name, u.current_user_name, u.application_name,"
        " pg_catalog.host(u.client_addr), u.query_id, u.fingerprint, u.statement,"
        " u.first_seen, u.last_seen, u.statements FROM fencekit.unfenced_writers u"
        " ORDER BY u.last_seen DESC, u.writer"
    ).fetchall()
    overflow = {
        r[0]: (int(r[1]), r[2])
        for r in conn.execute(
            "SELECT o.tag, o.statements, o.last_seen FROM fencekit.unfenced_overflow o"
        ).fetchall()
    }
    literal = conn.execute(
        "SELECT EXISTS (SELECT FROM fencekit.meta m WHERE m.key OPERATOR(pg_catalog.=)"
        " 'attribution_literals' AND m.value OPERATOR(pg_catalog.=) 'on')"
    ).fetchone()
    assert now is not None
    texts = _pgss_texts(conn, sorted({int(r[5]) for r in rows if r[5] is not None}))
    out = []
    for schema, name, tag, raw_spec, protected_at in registry:
        try:
            spec = FenceSpec.from_dict(json.loads(raw_spec))
        except (SpecError, ValueError):
            continue
        if wanted is not None and (schema, name) not in wanted:
            continue
        if wanted is None and spec.on_missing != "allow":
            continue
        writers = []
        for r in rows:
            if r[0] != tag:
                continue
            qid = int(r[5]) if r[5] is not None else None
            if qid is not None and qid in texts:
                text, source = texts[qid], "pg_stat_statements"
            else:
                text, source = str(r[7]), "literal" if literal and literal[0] else "fencekit"
            writers.append(
                Writer(
                    str(r[1]),
                    str(r[2]),
                    str(r[3]),
                    r[4],
                    qid,
                    str(r[6]),
                    text,
                    source,
                    r[8],
                    r[9],
                    int(r[10]),
                )
            )
        o_count, o_last = overflow.get(tag, (0, None))
        u_count, u_last = _unattributed(conn, tag)
        out.append(
            TableRollout(
                spec,
                protected_at,
                _attributed(conn, tag),
                writers,
                o_count,
                o_last,
                now,
                window,
                timedelta(seconds=int(lag)),
                since,
                [w for w in writers if since is None or w.last_seen >= since],
                u_count,
                u_last,
                unseen_paths(conn, spec),
            )
        )
    return out


def _unattributed(conn: Conn, tag: str) -> tuple[int, datetime | None]:
    """The table's unattributed count and last time (its sequences, public to read)."""
    row = conn.execute(
        "SELECT fencekit.counter_value(%s, 'unattributed'),"
        " pg_catalog.to_timestamp(fencekit.counter_value(%s, 'last_at:unattributed')"
        " OPERATOR(pg_catalog./) 1000.0::pg_catalog.float8)",
        [tag, tag],
    ).fetchone()
    if row is None:
        return 0, None
    return int(row[0] or 0), row[1]


class DBAPIConnection:
    """A DB-API connection (psycopg 3 or psycopg2, as alembic and Django hand them over) with
    the ``execute(...).fetchone()`` face this module reads through."""

    def __init__(self, dbapi: Any) -> None:
        self._dbapi = dbapi

    def execute(self, query: str, params: Any = None) -> Any:
        cursor = self._dbapi.cursor()
        cursor.execute(query, params)
        return cursor


def enforce_check(conn: Any, table: TableName, window: timedelta, *, force: bool) -> FenceSpec:
    """The spec that switches ``table`` to ``on_missing = reject``, or a CatalogError saying
    who still writes it without a token (unless ``force``). What the alembic and Django
    operations and ``fencekit enforce`` run before re-protecting."""
    spec = registered_spec(conn, table)
    why = enforce_refusal(conn, table, window)
    if why is not None and not force:
        raise CatalogError(why + ". Nothing was changed; fix that, or force it")
    return enforced_spec(spec)


def registered_spec(conn: Any, table: TableName) -> FenceSpec:
    """The spec ``table`` is protected with (read as text: psycopg2 hands jsonb over as a
    string), or a CatalogError."""
    row = conn.execute(
        "SELECT p.spec::pg_catalog.text FROM fencekit.protected p"
        " WHERE p.schema_name OPERATOR(pg_catalog.=) %s"
        "   AND p.table_name OPERATOR(pg_catalog.=) %s",
        [table.schema, table.name],
    ).fetchone()
    if row is None:
        raise CatalogError(f"{table} is not protected: protect it first")
    return FenceSpec.from_dict(json.loads(row[0]))


def _totals_refusal(conn: Conn, table: TableName, window: timedelta) -> str | None:
    """enforce_refusal for a role that may not read the writers themselves: the public totals
    (how many writers, when the last was seen) decide alike."""
    row = conn.execute(
        "SELECT t.writers, t.last_seen, pg_catalog.statement_timestamp(),"
        " fencekit.attribution_lag(), p.protected_at FROM fencekit.unfenced_writer_totals t"
        " JOIN fencekit.protected p ON p.schema_name OPERATOR(pg_catalog.=) t.schema_name"
        "  AND p.table_name OPERATOR(pg_catalog.=) t.table_name"
        " WHERE t.schema_name OPERATOR(pg_catalog.=) %s"
        "   AND t.table_name OPERATOR(pg_catalog.=) %s",
        [table.schema, table.name],
    ).fetchone()
    if row is None:
        return None
    writers, last, now, lag, since = row
    if since > now - window:
        return _too_early(table, since, window, since + window)
    if last is None:
        return None
    if last + timedelta(seconds=int(lag)) > now - window:
        return (
            f"{table} was written without a token within the last {_human(window)} "
            f"({writers} writer(s), last at {last:%Y-%m-%d %H:%M:%S%z}; fencekit rollout, as "
            "a member of fencekit_admin, names them)"
        )
    return None


#: What status reports that lets writes reach a protected table's rows unseen by its checks:
#: no statement check runs (missing, disabled, replica-only, or not fencekit's under its
#: name), or the statement names a table outside the tree (an ancestor: any, for a key or
#: table fence, whose checks are all statement-level). ENABLE ALWAYS is not among them:
#: such a trigger still fires.
_UNSEEN = frozenset(
    {
        DriftKind.TRIGGER_MISSING,
        DriftKind.TRIGGER_CHANGED,
        DriftKind.TRIGGER_DISABLED,
        DriftKind.TRIGGER_REPLICA_ONLY,
        DriftKind.PARTITION_TRIGGERS_MISSING,
        DriftKind.CHILD_TRIGGERS_MISSING,
        DriftKind.CHILD_OTHER_PARENT,
        DriftKind.UNPROTECTED_ANCESTOR,
        DriftKind.PROTECTED_ANCESTOR,
    }
)


def unseen_paths(conn: Conn, spec: FenceSpec) -> list[Drift]:
    """Where writes reach ``spec``'s rows that its checks do not see, judged by status's own
    code (:mod:`fencekit.catalog.drift`): the table or a partition or inheritance child of it
    lacking one of fencekit's triggers, or carrying one disabled, replica-only, or that is
    not fencekit's under its name (another function, events or timing); a table it inherits
    from (key and table fences, whose checks are all statement-level: any, protected or not;
    row fences: one not protected); and (key and table fences) a child that also inherits
    from a table outside the tree. A tokenless write through one is
    neither counted nor attributed, so the report cannot tell who sends it, and after
    enforce it is not refused either. The triggers of rows crossing partitions are left out:
    they judge tokens, and the statement checks count their statements. Catalog reads
    only; [] when the table is gone (status reports that)."""
    from fencekit import sqlgen
    from fencekit.catalog.drift import (
        _ancestor_drift,
        _descendant_drift,
        _descendants,
        _other_parent_drift,
        _trigger_drift,
    )

    row = conn.execute(
        "SELECT pg_catalog.to_regclass(%s)::pg_catalog.oid", [spec.table.sql]
    ).fetchone()
    if row is None or row[0] is None:
        return []
    oid, t = int(row[0]), spec.table
    objs, protect = sqlgen.table_objects(spec), Command(Action.PROTECT, spec)
    # Every protected table has these; the root guard only where PostgreSQL allows it.
    own = tuple(tr for tr in objs.triggers if not tr.root_only and not tr.partitioned_only)
    out = _trigger_drift(conn, oid, t.sql, t.dotted, own, protect)
    out += _ancestor_drift(conn, oid, t.dotted, spec.scope)
    descendants = _descendants(conn, oid)
    if spec.scope is not Scope.ROW:
        out += _other_parent_drift(conn, oid, descendants)
    for desc in descendants:
        out += _descendant_drift(conn, desc, objs, protect, False)
    return [d for d in out if d.kind in _UNSEEN]


def _in_words(c: Command) -> str:
    """An unseen path's fix in words, for a refusal that reaches a migration as well as the
    CLI (only protect: it re-creates what is missing)."""
    assert c.spec is not None, c
    return f"protect {c.spec.table} again"


def _unseen_refusal(table: TableName, unseen: list[Drift]) -> str:
    what = "; ".join(f"{d.message} (fix: {d.fix_text(_in_words)})" for d in unseen)
    return (
        f"writes reach {table}'s rows where its checks do not see them, so the report cannot "
        f"tell who writes them without a token, and enforcing would not refuse them: {what}; "
        "fix those, then watch the table for the window"
    )


def enforce_refusal(conn: Conn, table: TableName, window: timedelta) -> str | None:
    """Why ``table`` must not switch to ``on_missing = reject`` yet (None: go ahead): the
    rollout report's verdict (:attr:`TableRollout.refusal`). A role that may not read the
    writers is judged alike from the catalogs and the public totals."""
    spec = registered_spec(conn, table)
    try:
        report = rollout_report(conn, [table], window=window)
    except CatalogError:
        unseen = unseen_paths(conn, spec)
        if unseen:
            return _unseen_refusal(table, unseen)
        if not _attributed_table(conn, table):
            return _NOT_ATTRIBUTED.format(table=table)
        return _totals_refusal(conn, table, window)
    if not report:
        raise CatalogError(f"{table} is not protected")
    return report[0].refusal


def _too_early(table: TableName, since: datetime, window: timedelta, ready: datetime | None) -> str:
    at = f"; it is ready at {ready:%Y-%m-%d %H:%M:%S%z}" if ready is not None else ""
    return (
        f"{table} has been watched in rollout mode only since {since:%Y-%m-%d %H:%M:%S%z}, "
        f"less than the window ({_human(window)}): a writer that runs less often than that may "
        f"not have been seen yet{at}"
    )


def _unattributed_line(statements: int, last: datetime) -> str:
    return (
        f"{statements} tokenless statement(s) not attributed (their writer's record was busy, "
        "or the table's attribution log was full), "
        f"last seen {last:%Y-%m-%d %H:%M:%S%z}"
    )


def _human(d: timedelta) -> str:
    s = int(d.total_seconds())
    for unit, n in (("w", 604800), ("d", 86400), ("h", 3600), ("min", 60)):
        if s and s % n == 0:
            return f"{s // n}{unit}"
    return f"{s}s"
