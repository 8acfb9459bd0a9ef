"""fencekit's SECURITY DEFINER functions must not trust whoever calls them.

The attacker is an application role that may write ANOTHER
protected table (``other``) and only read the victim (``dv``); once as a plain DML role, once
also holding ``fencekit_writer`` (the grant writers needed until now, and which now only means
"may take leases"). Directly, it calls:

- ``fencekit.advance_fences`` (and ``lease_mismatch``): no longer executable by writers at all.
  42501, and the victim's fence unchanged.
- ``fencekit.reject`` with the victim's tag: executable by PUBLIC, but refused (42501) unless
  the transaction holds a write lock on the table in question, and the tag must be that
  table's. A read lock on the victim, or a write lock on ``other`` with the victim's tag, is
  not enough. ``fencekit.count_event`` (no longer a definer: it runs as the caller) refuses
  (42501) any reason but ``unfenced`` and ``bypassed``, whatever the caller holds. The victim's
  counters and gauges stay as they were.
- ``fencekit.lease_token`` (takes a FOR SHARE lock acquire waits on): 42501.
- ``fencekit.acquire`` without fencekit_writer: fencekit's own YF000 with the hint ``GRANT
  fencekit_writer TO <role>``, before taking any lock (a held lease row does not make it wait).

"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import FENCE, Conn, Findings, fences, outcome, protect

OTHER_DML = "SELECT, INSERT, UPDATE, DELETE ON other"
ROLES = {
    "a DML role of another table": ("sec_other", (OTHER_DML, "SELECT ON dv")),
    "the same with fencekit_writer": ("sec_legacy", (OTHER_DML, "SELECT ON dv", "fencekit_writer")),
}
BIG = 9223372036854775807


def _setup(db: Conn) -> dict[str, Any]:
    db.execute(
        "CREATE TABLE dv (id int PRIMARY KEY, k int NOT NULL, v text);"
        "CREATE TABLE other (id int PRIMARY KEY, k int NOT NULL, v text);"
    )
    for t in ("dv", "other"):
        protect(db, FenceSpec(TableName("public", t), scope=Scope.KEY, key=("k",)))
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    db.execute("INSERT INTO dv VALUES (1, 1, 'victim')")
    db.execute("INSERT INTO other VALUES (1, 1, 'mine')")
    db.execute("SELECT fencekit.acquire('billing:1', 'legit-holder', '1 hour')")
    db.commit()
    tags = dict(db.execute("SELECT table_name, tag FROM fencekit.protected").fetchall())
    relids = {t: db.execute("SELECT %s::regclass::oid", (t,)).fetchone()[0] for t in tags}
    db.rollback()
    return {"tags": tags, "relids": relids}


def _overloads(db: Conn, name: str) -> list[tuple[int, str]]:
    rows = db.execute(
        "SELECT oid, pg_get_function_identity_arguments(oid) FROM pg_proc "
        "WHERE proname = %s AND pronamespace = 'fencekit'::regnamespace",
        (name,),
    ).fetchall()
    db.rollback()
    return [(int(oid), args) for oid, args in rows]


def _watched(db: Conn) -> dict[str, Any]:
    """The victim's counters and gauges, and both tables' fences."""
    db.rollback()
    out: dict[str, Any] = {}
    for reason, count, last_at, max_gap in db.execute(
        "SELECT reason, count, last_rejected_at, max_token_gap FROM fencekit.rejections "
        "WHERE table_name = 'dv'"
    ).fetchall():
        out[f"dv {reason} count"] = count
        out["dv last_rejected_at"], out["dv max_token_gap"] = last_at, max_gap
    out["dv fences"], out["other fences"] = fences(db, "public.dv"), fences(db, "public.other")
    db.rollback()
    return out


def _changes(before: dict[str, Any], after: dict[str, Any]) -> str:
    return "; ".join(
        f"{k}: {before.get(k)} -> {after.get(k)}"
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    )


def test_definer_functions_refuse_callers_without_the_table(
    db: Conn, make_role, findings: Findings
) -> None:
    ids = _setup(db)
    tag, relid, other_relid = ids["tags"]["dv"], ids["relids"]["dv"], ids["relids"]["other"]

    def count_event(relid_: int) -> str:
        return f"SELECT fencekit.count_event('{tag}', {relid_}::oid, 'stale')"

    def reject(relid_: int) -> str:
        return (
            f"SELECT fencekit.reject('stale', '{tag}', {relid_}::oid, NULL, NULL, NULL, NULL, 1, "
            "1000001)"
        )

    lock_other = "LOCK TABLE other IN ROW EXCLUSIVE MODE; "
    read_dv = "LOCK TABLE dv IN ACCESS SHARE MODE; "
    calls = {
        "advance_fences on the victim's resource": "SELECT fencekit.advance_fences("
        f"'public.dv', ARRAY['1'], {BIG}, 'accept')",
        "advance_fences on the victim's resource, holding a write lock on its own table": lock_other
        + f"SELECT fencekit.advance_fences('public.dv', ARRAY['1'], {BIG}, 'accept')",
        "advance_fences on its own table's resource": "SELECT fencekit.advance_fences("
        f"'public.other', ARRAY['1'], {BIG}, 'accept')",
        "lease_mismatch": "SELECT fencekit.lease_mismatch('public.dv', ARRAY['1'], 1)",
        "count_event with the victim's tag": count_event(relid),
        "count_event with the victim's tag, holding a read lock on the victim": read_dv
        + count_event(relid),
        "count_event with the victim's tag, holding a write lock on its own table": lock_other
        + count_event(other_relid),
        "reject with the victim's tag": reject(relid),
        "reject with the victim's tag, holding a read lock on the victim": read_dv + reject(relid),
        "reject with the victim's tag, holding a write lock on its own table": lock_other
        + reject(other_relid),
        "lease_token": "SELECT fencekit.lease_token('billing:1')",
    }
    for who, (name, grants) in ROLES.items():
        dsn = make_role(name, *grants)
        with psycopg.connect(dsn) as conn:
            for what, stmt in calls.items():
                if "advance_fences" in what and db.execute(
                    "SELECT to_regprocedure('fencekit.advance_fences(text, text[], bigint, text)')"
                ).fetchone() == (None,):
                    continue  # signature changed: the EXECUTE check below covers it
                before = _watched(db)
                label = f"{who} calling {what}"
                got = outcome(conn, stmt)
                conn.rollback()
                findings.expect(label, got, "42501")
                after = _watched(db)
                findings.check(label, after == before, f"changed {_changes(before, after)}")
            # Whatever their signatures become: writers may not execute these at all.
            for fn in ("advance_fences", "lease_mismatch", "lease_token"):
                for oid, args in _overloads(db, fn):
                    may = db.execute(
                        "SELECT has_function_privilege(%s, %s::oid, 'EXECUTE')", (name, oid)
                    ).fetchone()
                    db.rollback()
                    findings.check(
                        f"{who}: EXECUTE on fencekit.{fn}({args})",
                        may == (False,),
                        "the role may execute it",
                    )
    findings.assert_clean()


def test_acquire_refuses_non_writers_before_locking(db: Conn, make_role) -> None:
    _setup(db)
    dsn = make_role("sec_other", OTHER_DML)
    # Another session holds the lease row: a refusal that took its lock first would wait here.
    db.execute("SELECT * FROM fencekit.leases WHERE resource = 'billing:1' FOR UPDATE")
    with psycopg.connect(dsn) as conn:
        got = outcome(
            conn,
            "SELECT fencekit.acquire('billing:1', 'intruder', '1 hour')",
            settings={"lock_timeout": "300ms"},
        )
        conn.rollback()
        assert got.sqlstate == "YF000", f"acquire by a non-writer: expected YF000, got {got}"
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT fencekit.acquire('billing:2', 'intruder', '1 hour')")
        conn.rollback()
        assert info.value.sqlstate == "YF000", f"expected YF000, got {info.value}"
        hint = info.value.diag.message_hint or ""
        assert "GRANT fencekit_writer TO sec_other" in hint, f"hint: {hint!r}"
    db.rollback()
    holders = db.execute("SELECT resource, holder FROM fencekit.leases ORDER BY 1").fetchall()
    db.rollback()
    assert holders == [("billing:1", "legit-holder")]


def test_fence_functions_cannot_be_attached_to_another_table(
    db: Conn, make_role, findings: Findings
) -> None:
    """The key and table fences' trigger functions run as the role that ran protect: a role that
    may create tables must not attach them to its own table to advance the victim's fences."""
    _setup(db)
    db.execute("CREATE TABLE dt (id int PRIMARY KEY, v text)")
    protect(db, FenceSpec(TableName("public", "dt"), scope=Scope.TABLE))
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    db.execute("INSERT INTO dt VALUES (1, 'victim')")
    db.commit()
    tags = dict(db.execute("SELECT table_name, tag FROM fencekit.protected").fetchall())
    db.rollback()
    attach = {
        "the key fence's AFTER INSERT function": (
            "public.dv",
            "AFTER INSERT",
            "REFERENCING NEW TABLE AS fencekit_new FOR EACH STATEMENT",
            f'fencekit."{tags["dv"]}_ins"()',
        ),
        "the table fence's statement function": (
            "public.dt",
            "BEFORE INSERT",
            "FOR EACH STATEMENT",
            f'fencekit."{tags["dt"]}_stmt"()',
        ),
    }
    for who, (name, grants) in ROLES.items():
        dsn = make_role(name, *grants, "CREATE ON SCHEMA public")
        with psycopg.connect(dsn) as conn:
            for i, (what, (resource, timing, level, fn)) in enumerate(attach.items()):
                before = fences(db, resource)
                db.rollback()
                mine = f"mine_{name}_{i}"
                got = outcome(
                    conn,
                    f"CREATE TABLE {mine} (id int, k int NOT NULL);"
                    f"CREATE TRIGGER steal {timing} ON {mine} {level} EXECUTE FUNCTION {fn};"
                    f"INSERT INTO {mine} VALUES (1, 1)",
                    token=BIG,
                )
                conn.commit()  # an attack that went through is kept, as an attacker would
                label = f"{who} attaching {what} to a table of its own"
                findings.expect(label, got, "42501")
                after = fences(db, resource)
                db.rollback()
                findings.check(label, after == before, f"{resource} fences {before} -> {after}")
    findings.assert_clean()


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_rejections_are_counted_after_a_rename(db, scope: str) -> None:
    """fencekit.writing() recognises the table by fencekit's triggers on it, not by the name in
    the registry: a renamed table's stale writes are still rejected and counted (YF001, not a
    permission error)."""
    from fencekit.sqlgen import protect_statements

    db.execute("CREATE TABLE before_rename (id int PRIMARY KEY, k int NOT NULL, v int)")
    spec = FenceSpec(
        TableName("public", "before_rename"),
        scope=Scope(scope),
        key=("k",) if scope == "key" else (),
    )
    for stmt in protect_statements(spec):
        db.execute(stmt.encode())
    db.execute("SELECT set_config('fencekit.token', '20', true)")
    db.execute("INSERT INTO before_rename VALUES (1, 1, 0)")
    db.commit()
    db.execute("ALTER TABLE before_rename RENAME TO after_rename")
    db.commit()
    db.execute("SELECT set_config('fencekit.token', '10', true)")
    with pytest.raises(psycopg.Error) as info:
        db.execute("UPDATE after_rename SET v = 1")
    db.rollback()
    assert info.value.sqlstate == "YF001", info.value
    tag = db.execute("SELECT tag FROM fencekit.protected").fetchone()[0]
    stale = db.execute("SELECT fencekit.counter_value(%s, 'stale')", (tag,)).fetchone()[0]
    db.rollback()
    assert stale == 1


def test_a_writer_cannot_borrow_fencekits_triggers_to_count_for_another_table(
    db, make_role
) -> None:
    """fencekit.writing() accepts a table that carries a trigger calling fencekit.<tag>_*. A
    writer that owns a table of its own must not be able to attach the victim's trigger
    functions to it (EXECUTE is kept from PUBLIC) and then count rejections for the victim."""
    from fencekit.sqlgen import protect_statements, table_objects

    db.execute("CREATE TABLE victim (id int PRIMARY KEY, v int)")
    spec = FenceSpec(TableName("public", "victim"))
    for stmt in protect_statements(spec):
        db.execute(stmt.encode())
    db.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    db.commit()
    objs = table_objects(spec)
    dsn = make_role("sec_borrower", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    with psycopg.connect(dsn) as attacker:
        attacker.execute("CREATE TABLE mine (id int PRIMARY KEY, fencekit_fence bigint)")
        attacker.commit()
        for f in objs.functions:
            if f.returns != "trigger":
                continue
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                attacker.execute(
                    f"CREATE TRIGGER borrowed BEFORE UPDATE ON mine FOR EACH ROW "
                    f"EXECUTE FUNCTION {f.sql_name}()"
                )
            attacker.rollback()
        attacker.execute("LOCK TABLE mine IN ROW EXCLUSIVE MODE")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            attacker.execute(
                "SELECT fencekit.count_event(%s, 'public.mine'::regclass, 'stale')",
                (objs.tag,),
            )
        attacker.rollback()
    stale = db.execute("SELECT fencekit.counter_value(%s, 'stale')", (objs.tag,)).fetchone()[0]
    db.rollback()
    assert stale in (None, 0)


def test_a_table_named_after_anothers_tag_cannot_count_rejections_for_it(db, make_role) -> None:
    """fencekit.writing() once matched the victim's tag as a prefix of trigger-function names:
    a writer's own protected table named '<victim tag>_x' (its functions '<victim tag>_x_<hash>_*')
    passed for the victim, and fencekit.reject() then counted forged rejections, gaps and
    lateness on the victim (the attacker's F7)."""
    from fencekit.sqlgen import protect_statements, table_objects

    db.execute("CREATE TABLE victim (id int PRIMARY KEY, v int)")
    victim = FenceSpec(TableName("public", "victim"))
    tag = table_objects(victim).tag
    db.execute(f'CREATE TABLE "{tag}_x" (id int PRIMARY KEY, v int)')
    mine = FenceSpec(TableName("public", f"{tag}_x"))
    for spec in (victim, mine):
        for stmt in protect_statements(spec):
            db.execute(stmt.encode())
    db.commit()
    assert table_objects(mine).tag.startswith(tag + "_")
    dsn = make_role("sec_prefix", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    with psycopg.connect(dsn) as attacker:
        attacker.execute(f'LOCK TABLE "{tag}_x" IN ROW EXCLUSIVE MODE')
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            attacker.execute(
                "SELECT fencekit.reject('stale', %s, %s::regclass, 'x', NULL, NULL, NULL, 1, 500)",
                (tag, f'public."{tag}_x"'),
            )
        attacker.rollback()
    stale = db.execute("SELECT fencekit.counter_value(%s, 'stale')", (tag,)).fetchone()[0]
    db.rollback()
    assert stale in (None, 0)
