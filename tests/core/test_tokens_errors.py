"""Token parsing, error shape (SQLSTATE, message, DETAIL JSON, diagnostic fields) and the
rejection counters that survive the rollback, on both servers."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from fencekit.errors import FenceError
from tests.core.helpers import (
    BYPASS_REFUSED,
    ISSUER_MISMATCH,
    MALFORMED,
    MISSING,
    REUSED,
    STALE,
    USAGE,
    Conn,
    detail,
    make_app_role,
    one,
    protect,
    reject,
    rejection_count,
    rows,
    write,
)

pytestmark = pytest.mark.all_servers

MALFORMED_TOKENS = [
    "abc",
    "1.5",
    "-3",
    "0",
    "1e3",
    " 34",
    "34 ",
    "034",
    "+34",
    "0x22",
    "9223372036854775808",  # bigint max + 1
    "99999999999999999999",
    "٣٤",  # Arabic-Indic digits: not plain decimal
]


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_malformed_tokens_are_rejected_and_write_nothing(db: Conn, scope: str) -> None:
    db.execute("CREATE TABLE m (k int PRIMARY KEY, v text)")
    protect(db, "m", scope, **({"key": ("k",)} if scope == "key" else {}))
    write(db, 5, "INSERT INTO m VALUES (1, 'a')")
    for bad in MALFORMED_TOKENS:
        err = reject(db, MALFORMED, bad, "INSERT INTO m VALUES (2, 'b')")
        assert repr(bad)[1:-1] in str(err) or bad in str(err), str(err)  # names the token
        reject(db, MALFORMED, bad, "UPDATE m SET v = 'x'")
        reject(db, MALFORMED, bad, "DELETE FROM m")
    assert rows(db, "SELECT k, v FROM m") == [(1, "a")]
    assert rejection_count(db, "m", "malformed") == 3 * len(MALFORMED_TOKENS)
    # The boundaries that are well formed.
    write(db, "9223372036854775807", "INSERT INTO m VALUES (2, 'max')")
    reject(db, STALE, "1", "UPDATE m SET v = 'one'")


def test_empty_token_reads_as_missing(db: Conn) -> None:
    """contracts.md: the token is read as NULLIF(current_setting(...), ''), so '' set
    explicitly is a missing token (YF003), not a malformed one."""
    db.execute("CREATE TABLE e (k int PRIMARY KEY)")
    protect(db, "e")
    err = reject(db, MISSING, "", "INSERT INTO e VALUES (1)")
    assert detail(err)["reason"] == "missing"
    assert one(db, "SELECT count(*) FROM e") == 0


def test_missing_after_an_earlier_transaction_set_a_token(db: Conn) -> None:
    db.execute("CREATE TABLE e (k int PRIMARY KEY)")
    protect(db, "e", "key", key=("k",))
    write(db, 5, "INSERT INTO e VALUES (1)")
    # The session has seen the setting; outside that transaction it reads '', not NULL.
    assert one(db, "SELECT current_setting('fencekit.token', true)") == ""
    reject(db, MISSING, None, "INSERT INTO e VALUES (2)")
    reject(db, MISSING, None, "DELETE FROM e")
    # SET LOCAL (not set_config) is the same transaction-local setting.
    db.execute("SET LOCAL fencekit.token = '6'")
    db.execute("INSERT INTO e VALUES (2)")
    db.commit()
    reject(db, MISSING, None, "INSERT INTO e VALUES (3)")
    assert rows(db, "SELECT k FROM e ORDER BY k") == [(1,), (2,)]


def _assert_error_shape(
    err: psycopg.Error, *, reason: str, table: str, column: str | None = None
) -> dict[str, object]:
    # A class PostgreSQL does not define: a DatabaseError (fencekit's class, registered with
    # psycopg), never mistaken for a serialization failure (retryable) or an integrity error.
    assert isinstance(err, psycopg.DatabaseError), type(err)
    assert isinstance(err, FenceError), type(err)
    retryable = (
        psycopg.errors.SerializationFailure,
        psycopg.IntegrityError,
        psycopg.OperationalError,
    )
    assert not isinstance(err, retryable), type(err)
    d = detail(err)
    assert set(d) == {"reason", "table", "key", "resource", "token", "fence", "late_ms"}
    assert d["reason"] == reason
    assert d["table"] == f"public.{table}"
    assert err.diag.schema_name == "public"
    assert err.diag.table_name == table
    assert (err.diag.constraint_name or "").startswith("fencekit_")
    assert err.diag.message_hint
    if column is not None:
        assert err.diag.column_name == column
    return d


def test_every_reason_has_its_own_sqlstate_and_a_full_error(db: Conn, make_role: object) -> None:
    db.execute("CREATE TABLE rowt (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE keyt (account int NOT NULL, v text)")
    db.execute("CREATE TABLE tabt (v text)")
    db.execute("CREATE TABLE oncet (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE etcdt (k int NOT NULL)")
    protect(db, "rowt")
    protect(db, "keyt", "key", key=("account",))
    protect(db, "tabt", "table")
    protect(db, "oncet", on_equal="reject")
    protect(db, "etcdt", "key", key=("k",), issuer="etcd")
    write(db, 34, "INSERT INTO rowt VALUES (42, 'a')")
    write(db, 34, "INSERT INTO keyt VALUES (42, 'a')")
    write(db, 34, "INSERT INTO tabt VALUES ('a')")
    write(db, 34, "INSERT INTO oncet VALUES (42, 'a')")
    seen: dict[str, str] = {}

    # stale, row fence: message names table, key, token and fence
    err = reject(db, STALE, 33, "UPDATE rowt SET v = 'b'")
    d = _assert_error_shape(err, reason="stale", table="rowt", column="fencekit_fence")
    assert (d["key"], d["token"], d["fence"]) == ({"id": "42"}, 33, 34)
    msg = err.diag.message_primary or ""
    for part in ("rowt", '"id"', "42", "33", "34"):
        assert part in msg, (part, msg)
    seen[STALE] = "stale"

    # stale, key fence
    err = reject(db, STALE, 33, "INSERT INTO keyt VALUES (42, 'b')")
    d = _assert_error_shape(err, reason="stale", table="keyt", column="account")
    assert (d["key"], d["resource"], d["token"], d["fence"]) == (
        {"account": "42"},
        "public.keyt",
        33,
        34,
    )
    msg = err.diag.message_primary or ""
    for part in ("keyt", "account", "42", "33", "34"):
        assert part in msg, (part, msg)

    # stale, table fence: no key
    err = reject(db, STALE, 33, "INSERT INTO tabt VALUES ('b')")
    d = _assert_error_shape(err, reason="stale", table="tabt")
    assert (d["key"], d["resource"], d["token"], d["fence"]) == (None, "public.tabt", 33, 34)

    err = reject(db, REUSED, 34, "UPDATE oncet SET v = 'b'")
    _assert_error_shape(err, reason="reused", table="oncet", column="fencekit_fence")
    seen[REUSED] = "reused"

    err = reject(db, MISSING, None, "UPDATE rowt SET v = 'b'")
    _assert_error_shape(err, reason="missing", table="rowt")
    seen[MISSING] = "missing"

    err = reject(db, MALFORMED, "3x", "UPDATE rowt SET v = 'b'")
    _assert_error_shape(err, reason="malformed", table="rowt")
    assert "3x" in (err.diag.message_primary or "")
    seen[MALFORMED] = "malformed"

    app_dsn = make_app_role(make_role, "errs_app")
    with psycopg.connect(app_dsn) as app:
        err = reject(app, BYPASS_REFUSED, 35, "UPDATE rowt SET v = 'b'", bypass=True)
    _assert_error_shape(err, reason="bypass_refused", table="rowt")
    assert "errs_app" in (err.diag.message_primary or "")
    seen[BYPASS_REFUSED] = "bypass_refused"

    err = reject(
        db,
        ISSUER_MISMATCH,
        40,
        "INSERT INTO etcdt VALUES (1)",
        settings={"fencekit.issuer": "zookeeper"},
    )
    _assert_error_shape(err, reason="issuer_mismatch", table="etcdt")
    seen[ISSUER_MISMATCH] = "issuer_mismatch"

    err = reject(db, USAGE, 40, "UPDATE rowt SET v = 'b'", settings={"fencekit.bypass": "perhaps"})
    _assert_error_shape(err, reason="usage", table="rowt")
    seen[USAGE] = "usage"

    assert len(set(seen.values())) == len(seen)  # one SQLSTATE per reason, none shared


def test_issuer_tag_must_match_a_bound_resource(db: Conn) -> None:
    db.execute("CREATE TABLE etcdt (k int NOT NULL)")
    protect(db, "etcdt", "key", key=("k",), issuer="etcd")
    write(db, 40, "INSERT INTO etcdt VALUES (1)")  # untagged: accepted
    write(db, 41, "INSERT INTO etcdt VALUES (1)", settings={"fencekit.issuer": "etcd"})
    reject(db, ISSUER_MISMATCH, 42, "DELETE FROM etcdt", settings={"fencekit.issuer": "zookeeper"})
    assert one(db, "SELECT count(*) FROM etcdt") == 2
    assert rejection_count(db, "etcdt", "issuer_mismatch") == 1


def test_rejections_are_counted_per_table_and_reason_and_survive_rollback(db: Conn) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY)")
    db.execute("CREATE TABLE b (id int PRIMARY KEY)")
    protect(db, "a")
    protect(db, "b")
    write(db, 10, "INSERT INTO a VALUES (1)")
    write(db, 10, "INSERT INTO b VALUES (1)")
    started = one(db, "SELECT clock_timestamp()")
    # Each rejection rolls its transaction back; a plain counter row would vanish with it.
    reject(db, STALE, 3, "UPDATE a SET id = 1")  # gap 7
    reject(db, STALE, 8, "UPDATE a SET id = 1")  # gap 2
    reject(db, MISSING, None, "DELETE FROM a")
    reject(db, MALFORMED, "x", "DELETE FROM a")
    ended = one(db, "SELECT clock_timestamp()")
    counts = dict(
        rows(
            db,
            "SELECT table_name || ':' || reason, count FROM fencekit.rejections WHERE count > 0",
        )
    )
    assert counts == {"a:stale": 2, "a:missing": 1, "a:malformed": 1}
    # Every row is about its own reason: a time only where that reason was rejected, the token
    # gap only on the stale row (a missing token has no gap).
    view = {
        reason: (last_at, gap)
        for reason, last_at, gap in rows(
            db,
            "SELECT reason, last_rejected_at, max_token_gap FROM fencekit.rejections "
            "WHERE table_name = 'a'",
        )
    }
    assert view["stale"][1] == 7
    assert view["missing"][1] is None
    assert view["malformed"][1] is None
    for reason in ("stale", "missing", "malformed"):
        last_at = view[reason][0]
        assert started - dt.timedelta(seconds=1) <= last_at <= ended + dt.timedelta(seconds=1)
    assert view["stale"][0] < view["missing"][0] < view["malformed"][0]
    assert {r for r, (last_at, _) in view.items() if last_at is not None} == {
        "stale",
        "missing",
        "malformed",
    }
    assert rows(
        db,
        "SELECT DISTINCT max_token_gap FROM fencekit.rejections WHERE table_name = 'b'",
    ) == [(None,)]
    # The view is readable by anyone; the counters are not writable through it.
    assert one(db, "SELECT has_table_privilege('public', 'fencekit.rejections', 'SELECT')")
