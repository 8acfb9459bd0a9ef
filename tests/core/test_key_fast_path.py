"""A key fence's fast path reads no catalog, and names every key as the full check's path does.

Keys of bigint, smallint, integer, text or uuid columns are printed by their output functions
in the statement that reads them, which tests their types as its plan has them: no write reads
``fencekit.protected`` or ``pg_attribute``, the first of a session included. Keys of any other
type take the full check on every write. Whether a write read ``fencekit.protected`` is counted
with ``pg_stat_xact_user_tables`` (the backend's own scans, before and after the write in one
transaction), so nothing here depends on time. A key column named like one of the key
function's variables is read as the column, and once it is no column (renamed away) the write
is refused by the full check.
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
    'text COLLATE "C"': ["b", "a", "B", "é"],
}


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
    # Every write, the session's first included, names its keys reading no registry.
    for value in values:
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
    assert _write_and_count(db, 10, insert, first) == 0
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
    [
        ("date", "2026-01-0{}"),
        ("acct", "{}"),
        ("character(3)", "x{}"),
    ],
    ids=["date", "domain", "character"],
)
def test_keys_outside_the_fast_path_read_the_registry_every_time(
    db: Conn, typ: str, value: str
) -> None:
    """A date prints by DateStyle, a domain is not built in, a character(n)'s cast to text
    drops the padding its output function prints: each of their writes checks the types first."""
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


@pytest.mark.parametrize("name", ["tok", "ok", "ks", "raw", "held", "found", "tg_op", "k"])
def test_a_key_column_named_like_a_variable_is_the_column(db: Conn, name: str) -> None:
    """The fast path names key columns unqualified: one named like a variable of the key
    function (or PL/pgSQL's own, FOUND, TG_OP) is read as the column. Renamed away, the name
    reads the statement's marker, of no fast type: the full check refuses the write."""
    db.execute(f'CREATE TABLE kv (id serial PRIMARY KEY, "{name}" text NOT NULL, v int)')
    db.commit()
    protect(db, "kv", "key", key=(name,))
    insert = f'INSERT INTO kv ("{name}", v) VALUES (%s, 0)'
    for value in ("a", "b"):
        assert _write_and_count(db, 10, insert, [value]) == 0, value
    write(db, 10, f'UPDATE kv SET v = v + 1 WHERE "{name}" = %s', ["a"])
    assert sorted(
        rows(db, "SELECT key, fence FROM fencekit.fences WHERE resource = 'public.kv'")
    ) == [
        ("a", 10),
        ("b", 10),
    ]
    db.rollback()
    db.execute(f'ALTER TABLE kv RENAME COLUMN "{name}" TO renamed')
    db.commit()
    err = reject(db, USAGE, 10, "UPDATE kv SET v = v + 1", [])
    assert f"key column {name} of public.kv" in str(err), err
