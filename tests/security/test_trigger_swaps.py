"""A table's owner renames one of fencekit's triggers onto another's name and copies that
one's stamp (the owner may comment its own triggers, and stamps are printed by ``fencekit sql
protect``): status used to compare names, enabled state and functions only, and several of
fencekit's triggers call the same function, so it reported nothing; re-protect trusted the
name and the stamp and kept the impostor. Status now compares what each trigger is (events,
timing, level, WHEN, transition tables), and re-protect replaces every trigger it makes.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from fencekit import catalog
from fencekit.ident import object_tag
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, protect

# (scope, relation of the swap, the trigger dropped, the trigger renamed onto its name)
SWAPS = {
    "key: the root's updating": ("key", "sw.t", "updating", "trunc"),
    "key: a partition's trunc": ("key", "sw.t1", "trunc", "ins"),
    "table: a partition's stmt": ("table", "sw.t1", "stmt", "trunc"),
}


def _drift(db: Conn) -> set[tuple[str, str]]:
    db.rollback()
    found = {(d.kind.value, d.object) for d in catalog.status(db).all_drift()}
    db.rollback()
    return found


@pytest.mark.parametrize("case", sorted(SWAPS))
def test_a_trigger_renamed_onto_another_is_found_and_replaced(
    db: Conn, make_role: Callable[..., str], case: str
) -> None:
    scope, rel, dropped, renamed = SWAPS[case]
    owner_dsn = make_role("sw_owner")
    db.execute("CREATE SCHEMA sw AUTHORIZATION sw_owner")
    db.commit()
    with psycopg.connect(owner_dsn) as owner:
        owner.execute(
            "CREATE TABLE sw.t (id int NOT NULL, k int NOT NULL, p int NOT NULL)"
            " PARTITION BY LIST (p)"
        )
        owner.execute("CREATE TABLE sw.t1 PARTITION OF sw.t FOR VALUES IN (1)")
        owner.commit()
    kw = {"key": ("k",)} if scope == "key" else {}
    spec = FenceSpec(TableName("sw", "t"), scope=Scope(scope), **kw)
    protect(db, spec)
    db.commit()
    assert _drift(db) == set()
    prefix = f"fencekit_{object_tag('sw', 't')}_"
    stamp = db.execute(
        "SELECT obj_description(oid, 'pg_trigger') FROM pg_trigger"
        " WHERE tgrelid = %s::regclass AND tgname = %s",
        (rel, prefix + dropped),
    ).fetchone()
    assert stamp is not None
    db.rollback()
    with psycopg.connect(owner_dsn) as owner:
        owner.execute(f'DROP TRIGGER "{prefix}{dropped}" ON {rel}')
        owner.execute(f'ALTER TRIGGER "{prefix}{renamed}" ON {rel} RENAME TO "{prefix}{dropped}"')
        comment = sql.SQL("COMMENT ON TRIGGER {} ON {} IS {}").format(
            sql.Identifier(prefix + dropped), sql.SQL(rel), sql.Literal(stamp[0])
        )
        owner.execute(comment)
        owner.commit()
    kinds = {kind for kind, obj in _drift(db) if obj.endswith(f"trigger {prefix}{dropped}")}
    assert kinds == {"trigger_changed"}, _drift(db)
    protect(db, spec)  # what status prescribes
    db.commit()
    assert _drift(db) == set()
