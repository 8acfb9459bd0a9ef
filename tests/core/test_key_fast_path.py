"""A key fence's fast path reads no registry, and names every key as the full check's path does.

A session's first write to a key-fenced table checks the key column types in the catalogs
(``fencekit.protected`` among them) and keeps the types it found in a session setting; its
next writes read only pg_attribute before they compute the keys' text. Whether a write
read ``fencekit.protected`` is counted with ``pg_stat_xact_user_tables`` (the backend's own
scans, before and after the write in one transaction), so nothing here depends on time.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.core.helpers import USAGE, Conn, one, protect, reject, rows, write

# Values at the edges of each type's text: signs, the extremes, quotes, commas, parentheses,
# backslashes, spaces, the empty string, non-ASCII, and an upper-case uuid (its text is lower
# case).
VALUES: dict[str, list[str]] = {
    "smallint": ["-32768", "0", "7", "32767"],
    "integer": ["-2147483648", "-1", "42", "2147483647"],
    "bigint": ["-9223372036854775808", "10", "9223372036854775807"],
    "text": ["", " a ", "x,y", '"q"', "(p)", "back\\slash", "naïve", "1.0"],
    "uuid": ["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "00000000-0000-0000-0000-000000000000"],
}
OIDS = {"smallint": "21", "integer": "23", "bigint": "20", "text": "25", "uuid": "2950"}


def _registry_reads(db: Conn) -> int:
    """Reads of fencekit.protected this backend has not reported yet (in the open
    transaction)."""
    row = db.execute(
        "SELECT COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0) FROM pg_stat_xact_user_tables"
        " WHERE relid = 'fencekit.protected'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _write_and_count(db: Conn, token: int, sql: str, params: Sequence[str | None]) -> int:
    """Write in a transaction of its own; how often the write read fencekit.protected (the
    counts not yet reported include earlier transactions': the difference is the write's)."""
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    before = _registry_reads(db)
    db.execute(sql, params)
    reads = _registry_reads(db) - before
    db.commit()
    return reads


def _tag(db: Conn, table: str) -> str:
    tag = str(one(db, "SELECT tag FROM fencekit.protected WHERE table_name = %s", (table,)))
    db.rollback()
    return tag


@pytest.mark.parametrize("typ", sorted(VALUES))
def test_the_fast_path_reads_no_registry_and_names_keys_alike(db: Conn, typ: str) -> None:
    db.execute(f"CREATE TABLE kf (id serial PRIMARY KEY, k {typ} NOT NULL, v int)")
    db.commit()
    protect(db, "kf", "key", key=("k",))
    values = VALUES[typ]
    insert = "INSERT INTO kf (k, v) VALUES (%s, 0)"
    # The session's first write checks the types in the catalogs and keeps them ...
    assert _write_and_count(db, 10, insert, [values[0]]) > 0
    setting = f"fencekit.key_types_{_tag(db, 'kf')}"
    assert one(db, "SELECT current_setting(%s, true)", (setting,)) == OIDS[typ]
    db.rollback()
    # ... and its next writes name their keys on the fast path, reading no registry.
    for value in values[1:]:
        assert _write_and_count(db, 10, insert, [value]) == 0, value
    got = {k for (k,) in rows(db, "SELECT key FROM fencekit.fences WHERE resource = 'public.kf'")}
    want = {k for (k,) in rows(db, "SELECT DISTINCT k::text FROM kf")}
    db.rollback()
    assert got == want


def test_the_fast_path_names_composite_keys_alike(db: Conn) -> None:
    """A key of several columns is the record of their texts; a key with a NULL part is no key
    (key columns must be NOT NULL): refused, on the fast path as on the full one."""
    db.execute("CREATE TABLE kc (id serial PRIMARY KEY, a bigint, b text, c uuid, v int)")
    db.commit()
    protect(db, "kc", "key", key=("a", "b", "c"))
    insert = "INSERT INTO kc (a, b, c, v) VALUES (%s, %s, %s, 0)"
    first = ["1", "x", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]
    assert _write_and_count(db, 10, insert, first) > 0
    parts: list[tuple[str | None, str | None, str | None]] = [
        ("-5", "x,y", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12"),
        ("7", '"(q)"', "00000000-0000-0000-0000-000000000001"),
        ("0", "", "00000000-0000-0000-0000-000000000000"),
    ]
    for a, b, c in parts:
        assert _write_and_count(db, 10, insert, [a, b, c]) == 0, (a, b, c)
    got = {k for (k,) in rows(db, "SELECT key FROM fencekit.fences WHERE resource = 'public.kc'")}
    want = {k for (k,) in rows(db, "SELECT DISTINCT ROW(a::text, b::text, c::text)::text FROM kc")}
    assert got == want
    for part in ([None, "x", first[2]], ["1", None, first[2]], ["1", "x", None]):
        reject(db, USAGE, 10, insert, part)


@pytest.mark.parametrize(
    ("typ", "value"),
    [("date", "2026-01-0{}"), ('text COLLATE "C"', "t{}"), ("acct", "{}")],
    ids=["date", "text in C", "domain"],
)
def test_keys_outside_the_fast_path_read_the_registry_every_time(
    db: Conn, typ: str, value: str
) -> None:
    """A date prints by DateStyle, a text key in the "C" collation sorts otherwise, a domain
    is not built in: each of their writes checks the types first."""
    db.execute("CREATE DOMAIN acct AS bigint")
    db.execute(f"CREATE TABLE ko (id serial PRIMARY KEY, k {typ} NOT NULL, v int)")
    db.commit()
    protect(db, "ko", "key", key=("k",))
    for day in (1, 2, 3):
        reads = _write_and_count(
            db, day, "INSERT INTO ko (k, v) VALUES (%s, 0)", [value.format(day)]
        )
        assert reads > 0, day
    got = {k for (k,) in rows(db, "SELECT key FROM fencekit.fences WHERE resource = 'public.ko'")}
    db.rollback()
    assert got == {value.format(day) for day in (1, 2, 3)}


def test_a_forged_type_setting_takes_the_catalog_check(db: Conn) -> None:
    """The setting is the session's own: a wrong value costs its writes the catalog check,
    which sets it right; the write is judged as any other."""
    db.execute("CREATE TABLE kg (id serial PRIMARY KEY, k integer NOT NULL, v int)")
    db.commit()
    protect(db, "kg", "key", key=("k",))
    setting = f"fencekit.key_types_{_tag(db, 'kg')}"
    insert = "INSERT INTO kg (k, v) VALUES (%s, 0)"
    for forged in ("25", "20", "23,23", "x", "", "1,2,3"):
        db.execute("SELECT set_config(%s, %s, false)", (setting, forged))
        assert _write_and_count(db, 10, insert, ["5"]) > 0, forged
        assert one(db, "SELECT current_setting(%s)", (setting,)) == "23", forged
        db.rollback()
    write(db, 10, "UPDATE kg SET v = v + 1")
    assert rows(db, "SELECT key, fence FROM fencekit.fences WHERE resource = 'public.kg'") == [
        ("5", 10)
    ]
    db.rollback()
