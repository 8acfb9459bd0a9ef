"""Triggers that are not fencekit's on a protected table (and those a write reaches through
it): which fire ahead of fencekit's last check, which can rewrite a row fence's column, which
fire after it, each with the hash of its code."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fencekit import sqlgen
from fencekit.catalog.codeinfo import Inspector
from fencekit.catalog.model import COMMAND, Action, Command, Conn, Drift, DriftKind
from fencekit.ident import quote_ident
from fencekit.spec import FenceSpec, Scope

__all__ = ["allow_fix", "foreign_trigger_drift", "other_triggers"]

# pg_trigger.tgtype bits (PostgreSQL's TRIGGER_TYPE_*).
_TG_ROW = 1
_TG_BEFORE = 2
_TG_EVENTS = ((4, "INSERT"), (16, "UPDATE"), (8, "DELETE"), (32, "TRUNCATE"))


@dataclass(frozen=True)
class _Trig:
    name: str
    tgtype: int
    enabled: str
    function: str  # schema.name
    cloned: bool  # a partition's clone of its parent's trigger
    function_oid: int
    args: bytes | None
    definition: str  # pg_get_triggerdef
    when_tree: str | None

    @property
    def row(self) -> bool:
        return bool(self.tgtype & _TG_ROW)

    @property
    def before(self) -> bool:
        return bool(self.tgtype & _TG_BEFORE)

    def events(self) -> list[str]:
        return [name for bit, name in _TG_EVENTS if self.tgtype & bit]

    def order(self) -> tuple[int, bytes]:
        """Firing order among the triggers of one event: BEFORE statement, BEFORE row, AFTER
        row, AFTER statement, and within each by name in byte order (as PostgreSQL sorts
        them)."""
        phase = (1 if self.row else 0) if self.before else (2 if self.row else 3)
        return (phase, self.name.encode())

    def describe(self) -> str:
        level = "row" if self.row else "statement"
        return f"{'BEFORE' if self.before else 'AFTER'} {level} trigger {self.name}"


def relation_triggers(conn: Conn, oid: int) -> list[_Trig]:
    return [
        _Trig(str(r[0]), int(r[1]), str(r[2]), str(r[3]), bool(r[4]), int(r[5]), r[6], r[7], r[8])
        for r in conn.execute(
            "SELECT t.tgname, t.tgtype::pg_catalog.int4, t.tgenabled::pg_catalog.text, "
            "n.nspname || '.' || p.proname, t.tgparentid <> 0, t.tgfoid, t.tgargs, "
            "pg_catalog.pg_get_triggerdef(t.oid), t.tgqual::pg_catalog.text "
            "FROM pg_catalog.pg_trigger t "
            "JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
            "WHERE t.tgrelid = %s AND NOT t.tgisinternal ORDER BY t.tgname",
            (oid,),
        ).fetchall()
    ]


def allow_fix(what: str, never: str = "a fencekit.* setting") -> str:
    """The fix of code fencekit did not generate: review it, then allow its hash (the
    drift's ALLOW command)."""
    return (
        f"review {what}; once you know it never sets {never}, allow its code (by its hash, "
        f"which survives renames; a changed body is reported again), as a member of "
        f"fencekit_admin: {COMMAND}"
    )


def _system(insp: Inspector, t: _Trig, spec: FenceSpec) -> bool:
    """A trigger whose function is PostgreSQL's own or an installed extension's, with no WHEN
    clause, and whose arguments do not name a row fence's column (such a function may write the
    column its arguments name, as ``autoinc`` does): it sets no setting, so it is not reported.
    A WHEN clause is an expression of the owner's: it can call ``set_config`` or, through
    ``query_to_xml``, any function without a catalog link to it, so such a trigger is reported
    whatever its function."""
    if t.when_tree is not None or not insp.system_function(t.function_oid):
        return False
    args = (t.args or b"").split(b"\0")
    return spec.scope is not Scope.ROW or spec.column.encode() not in args


def generated_triggers(conn: Conn) -> frozenset[tuple[str, str]]:
    """(name, function) of every trigger the protected tables' templates make: a trigger is
    fencekit's only when it is one of these. A trigger under fencekit's prefix that calls
    another function, or one of a table's functions under a name its template does not make
    (the owner may attach a row fence's TRUNCATE check, which it owns, anywhere, even as a
    BEFORE ROW trigger that drops every write), is not fencekit's: status reports it like any
    other trigger, and re-protect drops it (fencekit.drop_other_triggers)."""
    out: set[tuple[str, str]] = set()
    for (spec,) in conn.execute("SELECT spec::pg_catalog.text FROM fencekit.protected"):
        objs = sqlgen.table_objects(FenceSpec.from_dict(json.loads(spec)))
        out.update((t.name, f"fencekit.{t.function.name}") for t in objs.triggers)
    return frozenset(out)


def foreign_trigger_drift(
    conn: Conn,
    insp: Inspector,
    oid: int,
    rel_sql: str,
    spec: FenceSpec,
    objs: sqlgen.TableObjects,
    allowed: frozenset[str],
    clones: bool = True,
) -> list[Drift]:
    """Every trigger on one relation that is not fencekit's and fires, unless its code hash is
    allowed.

    fencekit's checks read the token; a trigger that fires ahead of the last of them on an
    event (in PostgreSQL's firing order: BEFORE statement, BEFORE row, AFTER row, AFTER
    statement, each by name) can set fencekit.token (set_config) or, at row level, change the
    row first (``foreign_trigger_first``). That last check is the row trigger on a row-fenced
    table (the statement check before it refuses only a missing or malformed token), the
    statement check on a table-fenced one, and on a key-fenced one the AFTER STATEMENT trigger
    (every BEFORE trigger and AFTER ROW trigger fires ahead of it; the root guard, an AFTER
    DELETE row trigger ``WHEN (false)``, is never queued and checks nothing). On a row-fenced
    table a BEFORE ROW INSERT/UPDATE trigger after fencekit's can also overwrite the fence
    column fencekit's trigger set (``foreign_trigger_fence_column``). Any other trigger fires
    after the checks, and can still set the token for the rest of the transaction, which the
    next statement's check reads (``foreign_trigger``). ``clones=False`` skips a partition's
    clones of its parent's triggers (reported on the parent).
    """
    ours = {tr.name for tr in objs.triggers}
    # fencekit's triggers that are never queued (the root guard, WHEN (false)): they judge
    # nothing, so they are not the check a foreign trigger fires ahead of or behind.
    never_queued = {tr.name for tr in objs.triggers if tr.when == "false"}
    trigs = relation_triggers(conn, oid)

    generated = generated_triggers(conn)

    def is_fencekit(t: _Trig) -> bool:
        return (t.name, t.function) in generated or (
            t.name in ours and t.function.startswith("fencekit.")
        )

    def is_check(t: _Trig) -> bool:
        return (
            is_fencekit(t) and t.name not in never_queued and " WHEN (false) " not in (t.definition)
        )

    # Disabled triggers never fire; ENABLE REPLICA ones only where fencekit's do not.
    firing = [t for t in trigs if t.enabled not in ("D", "R")]
    # The last of fencekit's checks that read the token on each event, in PostgreSQL's firing
    # order (_Trig.order): a foreign trigger ordered before it can hand it a token. On a row
    # fence that is the row trigger: the statement check before it only refuses a missing or
    # malformed token, and each row is judged by the token the row trigger reads.
    judge: dict[str, _Trig] = {}
    for event in ("INSERT", "UPDATE", "DELETE", "TRUNCATE"):
        checks = [t for t in firing if is_check(t) and event in t.events()]
        if checks:
            judge[event] = max(checks, key=_Trig.order)
    column = quote_ident(spec.column)
    out: list[Drift] = []
    for t in firing:
        if is_fencekit(t) or (t.cloned and not clones) or _system(insp, t, spec):
            continue
        sha = insp.trigger_hash(t.function_oid, t.args, t.definition, t.when_tree)
        if sha in allowed:
            continue
        ahead = [e for e in t.events() if e in judge and t.order() < judge[e].order()]
        rewrites = (
            spec.scope is Scope.ROW
            and t.row
            and t.before
            and bool({"INSERT", "UPDATE"} & set(t.events()))
        )
        obj = f"{rel_sql}: trigger {t.name}"
        never = "a fencekit.* setting" + (f" nor NEW.{column}" if rewrites else "")
        allow = allow_fix(f"{t.function}", never)
        if ahead:
            passed = sorted({judge[e].name for e in ahead})
            can = "set fencekit.token (set_config), so the statement is judged by a token its "
            can += "writer never presented"
            if t.row and spec.scope is not Scope.KEY:
                can += ", or change the row before fencekit checks it"
            if rewrites:
                can += f", and overwrite NEW.{column}, the row's fence"
            # PostgreSQL truncates names to 63 bytes.
            renamed = quote_ident(("zz_" + t.name).encode()[:63].decode(errors="ignore"))
            # A new name helps only a trigger that fires in the same phase as fencekit's check.
            movable = all(t.order()[0] == judge[e].order()[0] for e in ahead)
            move = (
                f"; renaming it (ALTER TRIGGER {quote_ident(t.name)} ON {rel_sql} RENAME TO "
                f"{renamed}) lets it fire after fencekit's check, where it is still reported: "
                "code that fires later can set the token for the transaction's next statements"
                if movable
                else "; it fires ahead of fencekit's check whatever its name"
            )
            out.append(
                Drift(
                    DriftKind.FOREIGN_TRIGGER_FIRST,
                    obj,
                    f"{t.describe()} (function {t.function}) fires on "
                    f"{' '.join(ahead)} ahead of fencekit's {', '.join(passed)}: it can {can}",
                    allow + move,
                    sha256=sha,
                    command=Command(Action.ALLOW, sha256=sha),
                )
            )
        elif rewrites:
            out.append(
                Drift(
                    DriftKind.FOREIGN_TRIGGER_FENCE_COLUMN,
                    obj,
                    f"BEFORE row trigger {t.name} (function {t.function}) fires on "
                    f"{' '.join(e for e in t.events() if e in ('INSERT', 'UPDATE'))} after "
                    f"fencekit's row trigger set the fence: it can overwrite NEW.{column}, the "
                    "row's fence, and let a later stale write in",
                    allow,
                    sha256=sha,
                    command=Command(Action.ALLOW, sha256=sha),
                )
            )
        else:
            out.append(
                Drift(
                    DriftKind.FOREIGN_TRIGGER,
                    obj,
                    f"{t.describe()} (function {t.function}) fires on {' '.join(t.events())} "
                    "after fencekit's check: it can set fencekit.token for the rest of the "
                    "transaction (set_config(..., true)), and the next statement's check reads "
                    "the swapped token",
                    allow,
                    sha256=sha,
                    command=Command(Action.ALLOW, sha256=sha),
                )
            )
    return out


def other_triggers(
    conn: Conn,
    insp: Inspector,
    oid: int,
    kind: DriftKind,
    obj: str,
    where: str,
    allowed: frozenset[str],
) -> list[Drift]:
    """The firing triggers (not fencekit's) of a relation a write reaches through another:
    a table a foreign key cascades into, a view written through."""
    out: list[Drift] = []
    generated = generated_triggers(conn)
    for t in relation_triggers(conn, oid):
        if (
            t.enabled in ("D", "R")
            or (t.name, t.function) in generated
            or insp.system_function(t.function_oid)
        ):
            continue
        sha = insp.trigger_hash(t.function_oid, t.args, t.definition, t.when_tree)
        if sha in allowed:
            continue
        out.append(
            Drift(
                kind,
                obj,
                f"{where}, whose {t.describe()} (function {t.function}) then runs in the "
                "writer's statement: it can set fencekit.token",
                allow_fix(t.function),
                sha256=sha,
                command=Command(Action.ALLOW, sha256=sha),
            )
        )
    return out
