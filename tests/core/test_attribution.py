"""Who writes without a token: attribution of unfenced writes in rollout mode.

Every statement a table in rollout mode (``on_missing = allow``) lets through without a token
is attributed to its writer in ``fencekit.unfenced_writers`` (22_attribution.sql): the login
role and the role it acts as, application_name, client address, the statement with literals
replaced, first and last seen, a count. Storage is capped per table (overflow counted), no
literal is kept unless a DBA opts in, and writers cannot erase or rewrite the rows.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.core.helpers import protect, rollout_tables, write

Conn = psycopg.Connection[Any]

SCOPES = {
    "a_row": {"scope": "row"},
    "a_key": {"scope": "key", "key": ("k",)},
    "a_table": {"scope": "table"},
}


@pytest.fixture
def tables(db: Conn) -> None:
    rollout_tables(db, "a", rows=2)


def writers(db: Conn, table: str) -> list[dict[str, Any]]:
    db.commit()
    cur = db.execute(
        "SELECT u.* FROM fencekit.unfenced_writers u JOIN fencekit.protected p USING (tag)"
        " WHERE p.table_name = %s ORDER BY u.first_seen, u.statement",
        [table],
    )
    assert cur.description is not None
    names = [d.name for d in cur.description]
    rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    db.commit()
    return rows


def tokenless(dsn: str, stmt: str, app: str = "test-app") -> None:
    with psycopg.connect(make_conninfo(dsn, application_name=app), autocommit=True) as c:
        c.execute(stmt)


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_second_role_and_a_second_application_name_are_separate_writers(
    db: Conn, dsn: str, tables: None, make_role: Any, table: str
) -> None:
    grants = "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public"
    web = make_role("attr_web", grants)
    cron = make_role("attr_cron", grants)
    tokenless(web, f"UPDATE {table} SET v = 'x' WHERE id = 1", "web")
    tokenless(web, f"UPDATE {table} SET v = 'y' WHERE id = 2", "web")  # same statement shape
    tokenless(cron, f"UPDATE {table} SET v = 'x' WHERE id = 1", "web")
    tokenless(web, f"UPDATE {table} SET v = 'x' WHERE id = 1", "nightly")
    got = {
        (w["session_user_name"], w["current_user_name"], w["application_name"], w["statement"])
        for w in writers(db, table)
    }
    shape = f"UPDATE {table} SET v = ? WHERE id = ?"
    assert got == {
        ("attr_web", "attr_web", "web", shape),
        ("attr_cron", "attr_cron", "web", shape),
        ("attr_web", "attr_web", "nightly", shape),
    }
    for w in writers(db, table):
        assert str(w["client_addr"]) in ("127.0.0.1", "::1", "None")
        assert w["first_seen"] <= w["last_seen"]
        assert w["statements"] >= 1
        assert len(w["fingerprint"]) == 32


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_role_set_with_set_role_is_the_writers_current_user(
    db: Conn, dsn: str, tables: None, make_role: Any, table: str
) -> None:
    make_role("attr_batch", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET ROLE attr_batch")
        c.execute(f"DELETE FROM {table} WHERE id = 2")
    (w,) = writers(db, table)
    assert (w["current_user_name"], w["statement"]) == (
        "attr_batch",
        f"DELETE FROM {table} WHERE id = ?",
    )
    assert w["session_user_name"] != "attr_batch"


@pytest.mark.parametrize("table", list(SCOPES))
def test_writes_with_a_token_or_bypassed_are_not_attributed_and_zero_row_ones_are(
    db: Conn, dsn: str, tables: None, table: str
) -> None:
    assert writers(db, table) == []  # the token's INSERT of the fixture
    write(db, 11, f"UPDATE {table} SET v = 'z'")
    write(db, None, f"UPDATE {table} SET v = 'z'", bypass=True)
    assert writers(db, table) == []
    # A statement that writes no row is still one the table would refuse under reject.
    tokenless(dsn, f"UPDATE {table} SET v = 'z' WHERE id = 12345")
    assert [w["statement"] for w in writers(db, table)] == [
        f"UPDATE {table} SET v = ? WHERE id = ?"
    ]


def test_rows_whose_token_was_cleared_part_way_are_attributed(db: Conn, tables: None) -> None:
    """A statement that carried a token and clears it part-way (a function in the statement):
    its check saw a token, so its rows are counted by the row checks, and they attribute them
    too, or the rollout report would call the table ready while such a writer remains."""
    db.execute(
        "CREATE FUNCTION public.clear_token() RETURNS boolean LANGUAGE sql VOLATILE "
        "AS $$ SELECT set_config('fencekit.token', '', true) IS NOT NULL $$"
    )
    db.commit()
    write(db, 100, "UPDATE a_row SET v = 'late' WHERE public.clear_token()")
    assert [w["statement"] for w in writers(db, "a_row")] == [
        "UPDATE a_row SET v = ? WHERE public.clear_token()"
    ]


@pytest.mark.parametrize("table", list(SCOPES))
def test_truncate_without_a_token_is_attributed(
    db: Conn, dsn: str, tables: None, table: str
) -> None:
    tokenless(dsn, f"TRUNCATE {table}")
    assert [w["statement"] for w in writers(db, table)] == [f"TRUNCATE {table}"]


def test_a_backend_counts_what_it_recorded_recently_in_one_row(
    db: Conn, dsn: str, tables: None
) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(30):
            c.execute("UPDATE a_row SET v = %s WHERE id = 1", [str(i)])
        # Literals in the text (a client-side binding driver): one writer as well.
        for i in range(30):
            c.execute(f"UPDATE a_row SET v = '{i}' WHERE id = {i % 2 + 1}".encode())
    rows = writers(db, "a_row")
    assert sorted(w["statement"] for w in rows) == [
        "UPDATE a_row SET v = $1 WHERE id = ?",
        "UPDATE a_row SET v = ? WHERE id = ?",
    ]
    # Recorded once; what came after is counted in the session until its next record.
    assert all(w["statements"] >= 1 for w in rows)


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_repeated_statement_is_recorded_once_a_period_and_literals_are_counted(
    db: Conn, dsn: str, tables: None, table: str
) -> None:
    """A backend records a statement it repeats (parameters, $1) once per 10-second period,
    and its check writes nothing in between. Statements with literals in their text share a
    coarse key (the text before its first quote or digit), which counts each one in a session
    setting until its next record (a later period) adds them."""
    stmt = f"UPDATE {table} SET v = $1 WHERE id = 1"
    key_of = (
        "SELECT p.tag || '_' || to_hex(hashtext(concat_ws(E'\\x1f', session_user,"
        " current_setting('role'), current_setting('application_name'), %s::text)))"
        " FROM fencekit.protected p WHERE p.table_name = %s"
    )
    with psycopg.connect(make_conninfo(dsn, application_name="counter"), autocommit=True) as c:
        for i in range(30):
            c.execute(stmt.replace("$1", "%s"), [str(i)])
        (key,) = c.execute(key_of, [stmt, table]).fetchone() or ("",)
        (period,) = c.execute(
            "SELECT current_setting('fencekit.seen_' || %s, true)", [key]
        ).fetchone() or ("",)
        assert period.isdigit()
        # Once, or twice when a period turned mid-loop.
        assert [w["statements"] for w in writers(db, table)] in ([1], [2])
        # Literals: one record, the rest counted under the coarse key.
        literal = f"UPDATE {table} SET v = '{{}}' WHERE id = 1"
        for i in range(30):
            c.execute(literal.format(i).encode())
        (coarse,) = c.execute(key_of, [re.split("['0-9]", literal)[0], table]).fetchone() or ("",)
        (pending,) = c.execute(
            "SELECT current_setting('fencekit.pending_' || %s, true)", [coarse]
        ).fetchone() or ("",)
        (shaped,) = [
            w
            for w in writers(db, table)
            if "'" not in w["statement"] and "$1" not in w["statement"]
        ]
        assert shaped["statements"] + int(pending) == 30
        # The coarse key recorded in an older period: the next statement is recorded, with
        # what was counted.
        c.execute("SELECT set_config('fencekit.seen_' || %s, '0', false)", [coarse])
        c.execute(literal.format("last").encode())
    (shaped,) = [w for w in writers(db, table) if "$1" not in w["statement"]]
    assert shaped["statements"] == 31


def test_the_cap_bounds_writers_per_table_and_counts_the_overflow(
    db: Conn, dsn: str, tables: None
) -> None:
    db.execute("INSERT INTO fencekit.meta VALUES ('attribution_cap', '2')")
    db.commit()
    for col in ("v", "k", "id"):
        tokenless(dsn, f"UPDATE a_key SET {col} = {col} WHERE id = 1")
    tokenless(dsn, "UPDATE a_key SET v = v || 'x'", "other")
    assert len(writers(db, "a_key")) == 2
    (over,) = db.execute(
        "SELECT statements FROM fencekit.unfenced_overflow o JOIN fencekit.protected p"
        " USING (tag) WHERE p.table_name = 'a_key'"
    ).fetchone() or (0,)
    assert over == 2
    db.commit()
    totals = db.execute(
        "SELECT writers, overflow_statements, last_seen IS NOT NULL"
        " FROM fencekit.unfenced_writer_totals WHERE table_name = 'a_key'"
    ).fetchone()
    assert totals == (2, 2, True)


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_writer_with_standard_conforming_strings_off_is_let_through_and_attributed(
    db: Conn, dsn: str, tables: None, table: str
) -> None:
    """fencekit.statement_shape's patterns are read when a session first runs it, under the
    session's standard_conforming_strings: off, a backslash in a '' string was an escape, a
    pattern turned invalid, and the tokenless write it attributed failed."""
    legacy = make_conninfo(
        dsn, application_name="legacy", options="-c standard_conforming_strings=off"
    )
    with psycopg.connect(legacy, autocommit=True) as c:
        c.execute(f"UPDATE {table} SET v = 'y' WHERE id = 1 AND k IN (1, 2, 3)")
    (w,) = writers(db, table)
    assert w["statement"] == f"UPDATE {table} SET v = ? WHERE id = ? AND k IN (?, ...)"


SECRET_TEXT, SECRET_NUMBER = "s3cr3t-card-4111", "987654321"
SECRET_WORDS = "mother maiden name"  # no digit: nothing but the lexer takes it out


@pytest.mark.parametrize(
    "stmt",
    [
        f"UPDATE a_row SET v = '{SECRET_TEXT}' WHERE id = {SECRET_NUMBER}",
        f"UPDATE a_row SET v = E'{SECRET_TEXT}\\\\n' WHERE id = 1",
        f"UPDATE a_row SET v = $q${SECRET_TEXT}$q$ WHERE id = 1",
        f"UPDATE a_row /* {SECRET_TEXT} ' */ SET v = 'it''s' WHERE id IN (1, {SECRET_NUMBER})",
        f"UPDATE a_row SET v = 'x' -- {SECRET_TEXT}\nWHERE id = 1",
        f"UPDATE a_row SET v = U&'{SECRET_TEXT}' WHERE id = {SECRET_NUMBER}.5e3",
        f"UPDATE a_row AS \"o'x\" SET v = '{SECRET_WORDS}' WHERE \"o'x\".id = {SECRET_NUMBER}",
        f"UPDATE a_row /* a /* nested */ {SECRET_WORDS} */ SET v = 'x' WHERE id = {SECRET_NUMBER}",
    ],
)
def test_no_literal_is_stored_unless_a_dba_opts_in(
    db: Conn, dsn: str, tables: None, stmt: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(stmt.encode())
    (w,) = writers(db, "a_row")
    stored = " ".join(str(v) for v in w.values())
    assert SECRET_TEXT not in stored
    assert SECRET_NUMBER not in stored
    assert "maiden" not in stored
    assert w["statement"].startswith("UPDATE a_row")


def test_quoted_identifiers_stay_in_the_shape(db: Conn, dsn: str, tables: None) -> None:
    """A quoted identifier is no literal, even with a quote in it ("o'x")."""
    tokenless(dsn, 'UPDATE "a_row" AS "o\'x" SET "v" = \'y\' WHERE "o\'x".id IN (1, 2)')
    (w,) = writers(db, "a_row")
    assert w["statement"] == 'UPDATE "a_row" AS "o\'x" SET "v" = ? WHERE "o\'x".id IN (?, ...)'


def test_literals_are_stored_when_a_dba_opts_in(db: Conn, dsn: str, tables: None) -> None:
    db.execute("INSERT INTO fencekit.meta VALUES ('attribution_literals', 'on')")
    db.commit()
    tokenless(dsn, f"UPDATE a_table SET v = '{SECRET_TEXT}' WHERE id = 1")
    (w,) = writers(db, "a_table")
    assert SECRET_TEXT in w["statement"]


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_writer_cannot_erase_or_rewrite_attribution(
    db: Conn, dsn: str, tables: None, make_role: Any, table: str
) -> None:
    app = make_role("attr_app", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    reader = make_role("attr_reader", "SELECT ON ALL TABLES IN SCHEMA public")
    tokenless(dsn, f"UPDATE {table} SET v = 'x' WHERE id = 1", "victim")
    before = writers(db, table)
    with psycopg.connect(app, autocommit=True) as c:
        for stmt in (
            "DELETE FROM fencekit.unfenced_writers",
            "UPDATE fencekit.unfenced_writers SET last_seen = '2000-01-01'",
            "TRUNCATE fencekit.unfenced_writers",
            "INSERT INTO fencekit.unfenced_writers SELECT * FROM fencekit.unfenced_writers",
            "DELETE FROM fencekit.unfenced_overflow",
            "SELECT * FROM fencekit.unfenced_writers",
            "UPDATE fencekit.meta SET value = '0' WHERE key = 'attribution_cap'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(stmt)
    # Recording directly, by a role that may not write the table and is not writing it: refused.
    with (
        psycopg.connect(reader, autocommit=True) as c,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        c.execute(
            "SELECT fencekit.record_unfenced_writer(p.tag, %s::regclass, 1000)"
            " FROM fencekit.protected p WHERE p.table_name = %s",
            [table, table],
        )
    # A role that may write it records, at most, its own identity: nobody else's row changes,
    # whatever application_name it claims.
    with psycopg.connect(app, autocommit=True) as c, c.transaction():
        c.execute("SET LOCAL application_name = 'victim'")
        c.execute(
            "SELECT fencekit.record_unfenced_writer(p.tag, %s::regclass, 1000)"
            " FROM fencekit.protected p WHERE p.table_name = %s",
            [table, table],
        )
    after = writers(db, table)
    assert [w for w in after if w["writer"] in {b["writer"] for b in before}] == before
    new = [w for w in after if w["writer"] not in {b["writer"] for b in before}]
    assert [(w["session_user_name"], w["current_user_name"]) for w in new] == [
        ("attr_app", "attr_app")
    ]
    # The totals are public: counts and times, no identities.
    with psycopg.connect(app, autocommit=True) as c:
        row = c.execute(
            "SELECT writers FROM fencekit.unfenced_writer_totals WHERE table_name = %s",
            [table],
        ).fetchone()
        assert row == (2,)


@pytest.mark.parametrize("table", list(SCOPES))
def test_recording_runs_no_code_of_the_table_owner(
    db: Conn, dsn: str, make_role: Any, table: str
) -> None:
    """Canary: the table's owner (not an admin) plants code everywhere an unqualified name or
    operator could resolve, and a writer puts that schema first on its search_path. Neither
    fencekit.attribute (run as the writer, or inside a key or table fence's definer trigger)
    nor fencekit.record_unfenced_writer (SECURITY DEFINER, the installer's) may run any of it:
    the canary records whoever runs it."""
    owner = make_role("attr_owner")
    db.execute("GRANT CREATE ON SCHEMA public TO attr_owner")
    db.execute("CREATE TABLE canary (fn text, cu text, su text)")
    db.execute("GRANT INSERT ON canary TO PUBLIC")
    db.commit()
    app = make_role("attr_writer", "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public")
    with psycopg.connect(owner, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, k int NOT NULL, v text)")
        c.execute(f"GRANT ALL ON {table} TO attr_writer")
        sig = {
            "hashtext": "(text)",
            "md5": "(text)",
            "concat_ws": "(text, text, text, text, text)",
            "concat": "(text, text, text)",
            "split_part": "(text, text, integer)",
            "to_hex": "(integer)",
            "current_setting": "(text, boolean)",
            "set_config": "(text, text, boolean)",
            "left": "(text, integer)",
            "host": "(inet)",
            "statement_timestamp": "()",
            "current_query": "()",
            "strpos": "(text, text)",
            "regexp_replace": "(text, text, text, text)",
            "btrim": "(text)",
            "clock_timestamp": "()",
            "format": "(text, text)",
            "to_regclass": "(text)",
        }
        for fn, args in sig.items():
            c.execute(
                f"CREATE FUNCTION public.{fn}{args} RETURNS text LANGUAGE plpgsql AS $$"
                f" BEGIN INSERT INTO public.canary VALUES ('{fn}', current_user, session_user);"
                " RETURN NULL; END $$"
            )
        c.execute(
            "CREATE FUNCTION public.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$"
            " BEGIN INSERT INTO public.canary VALUES ('=', current_user, session_user);"
            " RETURN $1 OPERATOR(pg_catalog.=) $2; END $$"
        )
        c.execute("CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = text_eq)")
    kw = SCOPES[table]
    protect(db, f"public.{table}", on_missing="allow", **kw)  # type: ignore[arg-type]
    with psycopg.connect(app, autocommit=True) as c:
        c.execute("SET search_path = public, pg_catalog")
        c.execute(f"INSERT INTO {table} VALUES (1, 1, 'a')")
        c.execute(f"UPDATE {table} SET v = 'b' WHERE id = 1")
        # Appended to the log, with a marker at the commit (then folded below).
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        c.execute(f"DELETE FROM {table} WHERE id = 2")
        c.execute("COMMIT")
    db.execute("SELECT fencekit.fold_unfenced_log(NULL)")
    assert [w["statement"] for w in writers(db, table)] == [
        f"INSERT INTO {table} VALUES (?, ...)",
        f"UPDATE {table} SET v = ? WHERE id = ?",
        f"DELETE FROM {table} WHERE id = ?",
    ]
    assert db.execute("SELECT * FROM canary").fetchall() == []


@pytest.mark.parametrize("table", list(SCOPES))
def test_nobody_records_attribution_for_a_table_it_does_not_write(
    db: Conn, dsn: str, tables: None, make_role: Any, table: str
) -> None:
    """Attribution is bound to the table protected as the tag: a role with no grant at all
    (passing its own TEMP table) and a writer of another protected table (passing the table
    it writes) are both refused, and nothing about ``table`` changes. Either could otherwise
    fill the cap with forged identities, hiding the real writers and blocking enforce."""
    db.execute("CREATE TABLE a_other (id int PRIMARY KEY, k int NOT NULL, v text)")
    db.commit()
    protect(db, "a_other", on_missing="allow")
    nobody = make_role("attr_nobody")
    other_writer = make_role("attr_other", "SELECT, INSERT, UPDATE, DELETE ON a_other")
    tokenless(dsn, f"UPDATE {table} SET v = 'x' WHERE id = 1", "real-app")
    before = writers(db, table)
    tag = db.execute("SELECT tag FROM fencekit.protected WHERE table_name = %s", [table]).fetchone()
    db.commit()
    assert tag is not None
    attempts = {nobody: "pg_temp.mine", other_writer: "a_other"}
    for role_dsn, relation in attempts.items():
        with psycopg.connect(role_dsn, autocommit=True) as c:
            c.execute("SET application_name = 'forged'")
            c.execute("CREATE TEMP TABLE mine (x int)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(
                    "SELECT fencekit.record_unfenced_writer(%s, %s::regclass, 1000000)",
                    [tag[0], relation],
                )
    assert writers(db, table) == before
    overflow = db.execute(
        "SELECT count(*) FROM fencekit.unfenced_overflow o JOIN fencekit.protected p"
        " USING (tag) WHERE p.table_name = %s",
        [table],
    ).fetchone()
    db.commit()
    assert overflow == (0,)


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_busy_overflow_record_counts_its_statements_as_unattributed(
    db: Conn, dsn: str, tables: None, make_role: Any, table: str
) -> None:
    """The overflow's record lock (like a writer's) is one any role can take: while another
    session holds it, tokenless statements are counted as unattributed, never lost."""
    db.execute("INSERT INTO fencekit.meta VALUES ('attribution_cap', '0')")
    row = db.execute("SELECT tag FROM fencekit.protected WHERE table_name = %s", [table]).fetchone()
    assert row is not None
    db.commit()
    holder = make_role("attr_overflow_holder")
    with psycopg.connect(holder, autocommit=True) as m:
        m.execute(
            "SELECT pg_advisory_lock(hashtext('fencekit.attribution'), hashtext(%s::text))",
            [row[0]],
        )
        for app in ("one", "two"):
            tokenless(dsn, f"UPDATE {table} SET v = 'x' WHERE id = 1", app)
    assert writers(db, table) == []
    totals = db.execute(
        "SELECT writers, overflow_statements, unattributed_statements, last_seen IS NOT NULL"
        " FROM fencekit.unfenced_writer_totals WHERE table_name = %s",
        [table],
    ).fetchone()
    assert totals == (0, 0, 2, True)
    # Nobody but fencekit counts them: not the holder, not a writer.
    with psycopg.connect(holder, autocommit=True) as m:
        for stmt in (
            "SELECT fencekit.count_unattributed(%s, -100, now())",
            "SELECT pg_catalog.nextval(pg_catalog.format('fencekit.%%I', %s || ':unattributed'))",
            "SELECT pg_catalog.setval(pg_catalog.format('fencekit.%%I',"
            " %s || ':last_at:unattributed'), 1)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                m.execute(stmt, [row[0]])
    # Once the lock is free, the next writer is recorded as before (in the overflow here).
    tokenless(dsn, f"UPDATE {table} SET v = 'y' WHERE id = 1", "three")
    db.commit()
    after = db.execute(
        "SELECT overflow_statements, unattributed_statements"
        " FROM fencekit.unfenced_writer_totals WHERE table_name = %s",
        [table],
    ).fetchone()
    assert after == (1, 2)


def test_no_count_a_writer_passes_can_fail_another_writers_statement(
    db: Conn, dsn: str, tables: None
) -> None:
    """The counts a session passes (its own settings, or a direct call) are bounded and the
    sums saturate: a writer can make its own counts large, never make another's write fail."""
    (tag,) = db.execute(
        "SELECT tag FROM fencekit.protected WHERE table_name = 'a_key'"
    ).fetchone() or ("",)
    huge = 9223372036854775806
    for _ in range(2):  # the same writer's row, and the counter of unattributed statements
        db.execute("SELECT fencekit.record_unfenced_writer(%s, 'a_key'::regclass, %s)", [tag, huge])
        db.execute("SELECT fencekit.count_unattributed(%s, %s, now())", [tag, huge])
    db.commit()
    tokenless(dsn, "INSERT INTO a_key VALUES (3, 3, 'c')", app="another-writer")
    db.execute("SELECT fencekit.count_unattributed(%s, 1, now())", [tag])
    db.commit()
    counts = {w["application_name"]: w["statements"] for w in writers(db, "a_key")}
    assert counts["another-writer"] == 1
    assert max(counts.values()) <= 9223372036854775807


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_write_late_in_a_long_message_is_seen_when_it_happens(
    db: Conn, dsn: str, tables: None, table: str
) -> None:
    """statement_timestamp() is the time the client's message arrived: it stays put across a
    message of several statements, and across a CALL's COMMITs. Attribution took its time and
    its 10-second period from it, so a writer's later writes kept an old last_seen and the
    report could say "ready to enforce" while the writer still wrote. The time is the clock's."""
    with psycopg.connect(dsn, autocommit=True) as c:
        start = c.execute("SELECT clock_timestamp()").fetchone()
        assert start is not None
        c.execute(f"SELECT pg_sleep(1.5); UPDATE {table} SET v = 'late' WHERE id = 1")
    (w,) = writers(db, table)
    assert (w["last_seen"] - start[0]).total_seconds() >= 1.5, (w["last_seen"], start[0])
