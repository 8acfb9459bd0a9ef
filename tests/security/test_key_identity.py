"""Key identity is typed, not printed: session settings cannot split one key into two fences.

A key fence keeps one fence per key VALUE. Writer B (fresh token 20)
writes a key under one group of session settings; stale writer A (token 10) writes the same
key value under other settings (TimeZone, DateStyle, IntervalStyle, bytea_output,
extra_float_digits) and spelled another way ('1.0' / '1.00' / '1', the same instant at other
offsets, hex / escape bytea, a braced upper-case uuid ...). A must get YF001 on every write
path: today the key is the value's text in A's session, a different text, so a fresh fence.

Protect must also refuse key columns whose type has no stable identity (SQLSTATE YF000, the
message naming the column and its type), accept the allowed types and domains over them, and
refuse tables sharing a named resource with key columns of unmatched types.

The property runs with hypothesis, bounded (40 examples), in one database per test function.
Each example is one transaction, rolled back at its end: B writes, then the settings and the
token change and A writes. The key fence compares tokens whatever transaction set the fence,
so this judges A exactly as a second session would, without a reset between examples.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import make_conninfo

from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements
from tests.security.conftest import (
    APP,
    DML,
    FENCE,
    FRESH,
    Conn,
    Findings,
    copy_text,
    protect,
    without_keys_guard,
)

Draw = Callable[[st.SearchStrategy[Any]], Any]

# ---------------------------------------------------------------- equal values, spelled apart

OFFSETS_MIN = [0, -300, -240, 60, 330, 345, 765, -570, 840]


def _tstz(draw: Draw, v: datetime) -> str:
    off = draw(st.sampled_from(OFFSETS_MIN))
    local = v.astimezone(timezone(timedelta(minutes=off)))
    sep = draw(st.sampled_from([" ", "T"]))
    hh, mm = divmod(abs(off), 60)
    sign = "+" if off >= 0 else "-"
    zones = [f"{sign}{hh:02}:{mm:02}"] + ([f"{sign}{hh:02}"] if mm == 0 else [])
    if off == 0:
        zones += ["Z", "UTC"]
    return local.strftime(f"%Y-%m-%d{sep}%H:%M:%S.%f") + draw(st.sampled_from(zones))


def _ts(draw: Draw, v: datetime) -> str:
    fmt = draw(
        st.sampled_from(
            [
                "%Y-%m-%d %H:%M:%S.%f",
                "%Y-%m-%dT%H:%M:%S.%f",
                "%b %d %Y %H:%M:%S.%f",
                "%Y-%m-%d %H:%M:%S.%f+05",  # a zone on a timestamp is ignored
            ]
        )
    )
    return v.strftime(fmt)


def _date(draw: Draw, v: date) -> str:
    return v.strftime(draw(st.sampled_from(["%Y-%m-%d", "%Y%m%d", "%b %d %Y", "%B %d, %Y"])))


def _bytea(draw: Draw, v: bytes) -> str:
    style = draw(st.sampled_from(["hex", "HEX", "octal"]))
    if style == "octal":
        return "".join(f"\\{b:03o}" for b in v)
    digits = v.hex()
    return "\\x" + (digits.upper() if style == "HEX" else digits)


def _numeric(draw: Draw, v: Decimal) -> str:
    plain = format(v.normalize(), "f") if v else "0"
    spellings = [f"{v:.2f}", f"{v:.4f}", plain, f"{v:e}", f"{v:.1f}" if v == round(v, 1) else plain]
    if v >= 0:
        spellings += [f"+{v:.2f}", f"000{v:.2f}"]
    return str(draw(st.sampled_from(spellings)))


def _int(draw: Draw, v: int) -> str:
    spellings = [str(v), f"  {v}  ", f"{v:06d}"] + ([f"+{v}"] if v >= 0 else [])
    return str(draw(st.sampled_from(spellings)))


def _uuid(draw: Draw, v: uuid.UUID) -> str:
    return str(draw(st.sampled_from([str(v), str(v).upper(), "{" + str(v) + "}", v.hex])))


def _time(draw: Draw, v: time) -> str:
    return str(
        draw(
            st.sampled_from(
                [v.strftime("%H:%M:%S.%f"), v.isoformat(), v.strftime("%I:%M:%S.%f %p")]
            )
        )
    )


def _bool(draw: Draw, v: bool) -> str:
    yes, no = (
        ["true", "t", "yes", "on", "1", "TRUE", "y"],
        ["false", "f", "no", "off", "0", "FALSE"],
    )
    return str(draw(st.sampled_from(yes if v else no)))


def _same(draw: Draw, v: str) -> str:
    return v


@dataclass(frozen=True)
class Column:
    type: str
    values: st.SearchStrategy[Any]
    spell: Callable[[Draw, Any], str]


INSTANTS = st.datetimes(
    min_value=datetime(1901, 1, 1),
    max_value=datetime(2099, 12, 31),
    timezones=st.just(timezone.utc),
)
TSTZ = Column("timestamptz", INSTANTS, _tstz)
BYTEA = Column("bytea", st.binary(min_size=1, max_size=6), _bytea)
DATE = Column("date", st.dates(min_value=date(1901, 1, 1), max_value=date(2099, 12, 31)), _date)

# table -> key columns (a key of several columns is ROW(...) of them)
KINDS: dict[str, tuple[Column, ...]] = {
    "k_timestamptz": (TSTZ,),
    "k_timestamp": (
        Column(
            "timestamp",
            st.datetimes(min_value=datetime(1901, 1, 1), max_value=datetime(2099, 12, 31)),
            _ts,
        ),
    ),
    "k_date": (DATE,),
    "k_bytea": (BYTEA,),
    "k_numeric": (
        Column(
            "numeric(10,2)",
            st.decimals(min_value=-99999999, max_value=99999999, places=2),
            _numeric,
        ),
    ),
    "k_text": (
        Column(
            "text",
            st.text(
                st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6
            ),
            _same,
        ),
    ),
    "k_varchar": (  # its own family, printed without the settings pinned
        Column(
            "varchar(8)",
            st.text(
                st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6
            ),
            _same,
        ),
    ),
    "k_int": (Column("integer", st.integers(-(2**31), 2**31 - 1), _int),),
    "k_uuid": (Column("uuid", st.uuids(), _uuid),),
    "k_time": (Column("time", st.times(), _time),),
    "k_bool": (Column("boolean", st.booleans(), _bool),),
    "k_domain": (Column("ts_domain", INSTANTS, _tstz),),  # a domain over timestamptz
    "k_multi": (DATE, BYTEA, TSTZ),
}

SESSION_SETTINGS = st.fixed_dictionaries(
    {
        "TimeZone": st.sampled_from(
            ["UTC", "America/New_York", "Asia/Kolkata", "Pacific/Chatham", "Australia/Lord_Howe"]
        ),
        "DateStyle": st.sampled_from(
            [
                "ISO, MDY",
                "ISO, DMY",
                "SQL, DMY",
                "SQL, MDY",
                "German",
                "Postgres, MDY",
                "Postgres, DMY",
            ]
        ),
        "IntervalStyle": st.sampled_from(
            ["postgres", "postgres_verbose", "sql_standard", "iso_8601"]
        ),
        "bytea_output": st.sampled_from(["hex", "escape"]),
        "extra_float_digits": st.sampled_from(["-15", "0", "1", "3"]),
    }
)
STALE_A = FENCE  # A's token: lower than B's FRESH
PATHS = ["INSERT", "UPDATE", "DELETE", "INSERT ON CONFLICT DO UPDATE", "MERGE", "COPY FROM STDIN"]


@dataclass(frozen=True)
class Case:
    table: str
    spelled_b: tuple[str, ...]  # how writer B wrote the key
    spelled_a: tuple[str, ...]  # how stale writer A wrote the same key value
    settings_b: dict[str, str]
    settings_a: dict[str, str]
    path: str


@st.composite
def cases(draw: Draw) -> Case:
    table = draw(st.sampled_from(sorted(KINDS)))
    spelled_b, spelled_a = [], []
    for col in KINDS[table]:
        value = draw(col.values)
        spelled_b.append(col.spell(draw, value))
        spelled_a.append(col.spell(draw, value))
    return Case(
        table,
        tuple(spelled_b),
        tuple(spelled_a),
        draw(SESSION_SETTINGS),
        draw(SESSION_SETTINGS),
        draw(st.sampled_from(PATHS)),
    )


def _schema(db: Conn) -> None:
    db.execute(
        "CREATE DOMAIN ts_domain AS timestamptz;CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');"
    )
    for table, cols in KINDS.items():
        defs = ", ".join(f"k{i} {c.type} NOT NULL" for i, c in enumerate(cols))
        db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, {defs}, v text)")
        key = tuple(f"k{i}" for i in range(len(cols)))
        protect(db, FenceSpec(TableName("public", table), scope=Scope.KEY, key=key))
    db.commit()


def _lits(db: Conn, case: Case, spelled: tuple[str, ...]) -> str:
    cols = KINDS[case.table]
    return ", ".join(
        sql.SQL("{}::{}").format(sql.Literal(s), sql.SQL(c.type)).as_string(db)
        for s, c in zip(spelled, cols, strict=True)
    )


def _stale_write(db: Conn, case: Case) -> psycopg.Error | None:
    """A's write of B's key, spelled A's way; the error it raised, or None."""
    t = case.table
    names = [f"k{i}" for i in range(len(KINDS[t]))]
    cols = ", ".join(names)
    lits = _lits(db, case, case.spelled_a)
    stmt = {
        "INSERT": f"INSERT INTO {t} (id, {cols}, v) VALUES (2, {lits}, 'A')",
        "UPDATE": f"UPDATE {t} SET v = 'A' WHERE ({cols}) = ({lits})",
        "DELETE": f"DELETE FROM {t} WHERE ({cols}) = ({lits})",
        "INSERT ON CONFLICT DO UPDATE": f"INSERT INTO {t} (id, {cols}, v) VALUES (1, {lits}, 'A') "
        "ON CONFLICT (id) DO UPDATE SET v = excluded.v, "
        + ", ".join(f"{n} = excluded.{n}" for n in names),
        "MERGE": f"MERGE INTO {t} USING (SELECT {lits}) AS s({cols}) "
        f"ON ({', '.join(f'{t}.{n}' for n in names)}) = ({', '.join(f's.{n}' for n in names)}) "
        "WHEN MATCHED THEN UPDATE SET v = 'A'",
        "COPY FROM STDIN": f"COPY {t} (id, {cols}, v) FROM STDIN",
    }[case.path]
    try:
        if case.path == "COPY FROM STDIN":
            with db.cursor().copy(stmt) as copy:
                copy.write("\t".join(["2", *map(copy_text, case.spelled_a), "A"]) + "\n")
        else:
            db.execute(stmt)
    except psycopg.Error as exc:
        return exc
    return None


def _apply(db: Conn, values: dict[str, str], token: int) -> None:
    for name, value in values.items():
        db.execute("SELECT set_config(%s, %s, true)", (name, value))
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))


def _run_case(db: Conn, case: Case, role: str | None) -> None:
    t = case.table
    cols = ", ".join(f"k{i}" for i in range(len(KINDS[t])))
    db.rollback()
    try:
        if role:
            db.execute(f"SET LOCAL ROLE {role}")
        _apply(db, case.settings_b, FRESH)
        try:
            lits_b = _lits(db, case, case.spelled_b)
            db.execute(f"INSERT INTO {t} (id, {cols}, v) VALUES (1, {lits_b}, 'B')")
        except psycopg.Error as exc:
            raise AssertionError(
                f"writer B (fresh token {FRESH}) could not write {t}: {exc.sqlstate} {exc}"
            ) from None
        _apply(db, case.settings_a, STALE_A)
        # Precondition: A's spelling is B's value (else this would test nothing).
        same = db.execute(
            f"SELECT count(*) FROM {t} WHERE ({cols}) = ({_lits(db, case, case.spelled_a)})"
        ).fetchone()
        assert same == (1,), f"test generator bug: {case.spelled_a} is not {case.spelled_b}"
        err = _stale_write(db, case)
        got = "success" if err is None else f"{err.sqlstate} {err}"
        assert got.startswith("YF001 "), (
            f"stale writer A (token {STALE_A}) wrote key {case.spelled_a} of {t} by {case.path} "
            f"under {case.settings_a} after B wrote it as {case.spelled_b} under "
            f"{case.settings_b} (token {FRESH}): expected YF001, got {got}"
        )
    finally:
        db.rollback()


def _property(db: Conn, role: str | None) -> None:
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(cases())
    def check(case: Case) -> None:
        if case.path == "MERGE" and db.info.server_version < 150000:
            # MERGE arrived in PostgreSQL 15: the other paths carry the property there.
            case = replace(case, path="INSERT ON CONFLICT DO UPDATE")
        _run_case(db, case, role)

    check()


def test_key_identity_ignores_session_settings_as_owner(db: Conn) -> None:
    _schema(db)
    _property(db, None)


def test_key_identity_ignores_session_settings_as_app_role(db: Conn, make_role) -> None:
    _schema(db)
    make_role(APP, DML)
    _property(db, APP)


# ---------------------------------------------------------------- what protect accepts

# Refused key column types: (type, names the message may call it). Domains are created below.
REFUSED = [
    ("real", ("real", "float4")),
    ("double precision", ("double precision", "float8")),
    ("numeric", ("numeric",)),  # unconstrained: 1.0 = 1.00, printed apart
    ("interval", ("interval",)),  # '1 day' = '24 hours'
    ("timetz", ("time with time zone", "timetz")),
    ("money", ("money",)),
    ("json", ("json",)),
    ("jsonb", ("jsonb",)),
    ("integer[]", ("integer[]", "int4[]", "_int4")),
    ("text[]", ("text[]", "_text")),
    ("pair", ("pair",)),  # a composite type
    ("int4range", ("int4range",)),  # not on the allow-list
    ("inet", ("inet",)),  # not on the allow-list
    ("dom_float", ("dom_float", "double precision", "float8")),
    ("dom_interval", ("dom_interval", "interval")),
    ("dom_numeric", ("dom_numeric", "numeric")),
    ("mood", ("mood",)),  # an enum: RENAME VALUE would re-key its fences
]
ACCEPTED = [
    "smallint",
    "integer",
    "bigint",
    "numeric(12,3)",
    "text",
    "varchar(20)",
    "character varying",
    "char(4)",
    'text COLLATE "C"',
    "uuid",
    "boolean",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "bytea",
    "dom_int",
    "dom_money_ok",  # a domain over numeric(10,2)
    "dom_ts",
]
TYPES = """
CREATE TYPE pair AS (a int, b int);
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN dom_float AS double precision;
CREATE DOMAIN dom_interval AS interval;
CREATE DOMAIN dom_numeric AS numeric;
CREATE DOMAIN dom_int AS integer CHECK (VALUE > 0);
CREATE DOMAIN dom_money_ok AS numeric(10,2);
CREATE DOMAIN dom_ts AS timestamptz;
"""


def _try_protect(db: Conn, spec: FenceSpec) -> psycopg.Error | None:
    db.execute("SAVEPOINT try_protect")
    try:
        for stmt in protect_statements(spec):
            db.execute(stmt.encode())
    except psycopg.Error as exc:
        db.execute("ROLLBACK TO SAVEPOINT try_protect")
        return exc
    db.execute("RELEASE SAVEPOINT try_protect")
    return None


def _refusal(findings: Findings, label: str, err: psycopg.Error | None, column: str, names) -> None:
    if not findings.check(label, err is not None, "protect accepted it"):
        return
    assert err is not None
    if not findings.check(
        label, err.sqlstate == "YF000", f"expected YF000, got {err.sqlstate}: {err}"
    ):
        return
    msg = str(err).lower()
    findings.check(label, column in msg, f"the message does not name column {column!r}: {err}")
    findings.check(
        label,
        any(n.lower() in msg for n in names),
        f"the message does not name the type ({' or '.join(names)}): {err}",
    )


def test_protect_refuses_key_types_without_stable_identity(db: Conn, findings: Findings) -> None:
    db.execute(TYPES)
    for i, (typ, names) in enumerate(REFUSED):
        column = f"key_{i}_{typ.split('[')[0].split(' ')[0]}"
        db.execute(f"CREATE TABLE r{i} (id int, {column} {typ} NOT NULL)")
        spec = FenceSpec(TableName("public", f"r{i}"), scope=Scope.KEY, key=(column,))
        _refusal(findings, f"key column {column} {typ}", _try_protect(db, spec), column, names)
    # One bad column among good ones is enough to refuse.
    db.execute("CREATE TABLE rmix (a int NOT NULL, b text NOT NULL, c_float float8 NOT NULL)")
    spec = FenceSpec(TableName("public", "rmix"), scope=Scope.KEY, key=("a", "b", "c_float"))
    _refusal(
        findings,
        "key (a int, b text, c_float float8)",
        _try_protect(db, spec),
        "c_float",
        ("double precision", "float8"),
    )
    db.rollback()
    findings.assert_clean()


def test_protect_accepts_key_types_with_stable_identity(db: Conn, findings: Findings) -> None:
    """Control: the refusal must not reach the allowed types (decision 4's list)."""
    db.execute(TYPES)
    for i, typ in enumerate(ACCEPTED):
        db.execute(f"CREATE TABLE a{i} (id int, k {typ} NOT NULL)")
        spec = FenceSpec(TableName("public", f"a{i}"), scope=Scope.KEY, key=("k",))
        err = _try_protect(db, spec)
        findings.check(f"key column of type {typ}", err is None, f"refused: {err}")
    db.rollback()
    findings.assert_clean()


@pytest.mark.all_servers
def test_protect_refuses_nondeterministic_collations(
    db: Conn, pg_target: str, findings: Findings
) -> None:
    try:
        db.execute(
            "CREATE COLLATION ci "
            "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
        )
    except psycopg.errors.FeatureNotSupported as exc:
        # Nondeterministic collations exist only with ICU; this server cannot make the column.
        pytest.skip(f"{pg_target}: this PostgreSQL build has no ICU ({exc})")
    db.execute("CREATE DOMAIN ci_text AS text COLLATE ci")
    for name, typ, names in [
        ("key_ci_text", "text COLLATE ci", ("text", "ci", "nondeterministic")),
        ("key_ci_varchar", "varchar(20) COLLATE ci", ("varchar", "character varying", "ci")),
        ("key_ci_domain", "ci_text", ("ci_text", "text", "ci")),
    ]:
        table = f"t_{name}"
        db.execute(f"CREATE TABLE {table} (id int, {name} {typ} NOT NULL)")
        spec = FenceSpec(TableName("public", table), scope=Scope.KEY, key=(name,))
        _refusal(findings, f"key column {name} {typ}", _try_protect(db, spec), name, names)
    # Control: an ICU collation that is deterministic keeps one identity per value.
    db.execute('CREATE TABLE t_icu_det (id int, k text COLLATE "und-x-icu" NOT NULL)')
    err = _try_protect(db, FenceSpec(TableName("public", "t_icu_det"), scope=Scope.KEY, key=("k",)))
    findings.check(
        'key column text COLLATE "und-x-icu" (deterministic)', err is None, f"refused: {err}"
    )
    db.rollback()
    findings.assert_clean()


def test_shared_resource_needs_matching_key_types(db: Conn, findings: Findings) -> None:
    cases = [  # (table, key type, resource, accepted)
        ("s_int", "int", "ints", True),
        ("s_big", "bigint", "ints", True),  # integers match integers
        ("s_small", "smallint", "ints", True),
        ("s_text1", "text", "ints", False),
        ("s_date1", "date", "ints", False),
        ("s_varchar0", "varchar", "texts", True),
        ("s_text2", "text", "texts", True),  # text and unbounded varchar match each other
        # storing into varchar(n) trims trailing spaces beyond n: 'ab  ' is 'ab' there
        ("s_varchar", "varchar(10)", "texts", False),
        ("s_varchar1", "varchar(10)", "varchars", True),
        ("s_varchar2", "varchar(2)", "varchars", False),
        ("s_date2", "date", "texts", False),
        ("s_int2", "int", "texts", False),
        # char(n) prints without its trailing spaces, which text and varchar keep
        ("s_char", "char(5)", "texts", False),
        ("s_char1", "char(5)", "chars", True),
        ("s_char2", "char(8)", "chars", True),
        # a precision rounds: 00:00:00.6 is 00:00:01 in timestamptz(0)
        ("s_ts", "timestamptz", "times", True),
        ("s_ts0", "timestamptz(0)", "times", False),
        ("s_ts6", "timestamptz(6)", "times", True),  # 6 digits: an unbounded one's
        ("s_tsp0", "timestamptz(0)", "times0", True),
        ("s_tsp0b", "timestamptz(0)", "times0", True),
    ]
    for table, typ, resource, accepted in cases:
        db.execute(f"CREATE TABLE {table} (k {typ} NOT NULL)")
        spec = FenceSpec(TableName("public", table), scope=Scope.KEY, key=("k",), resource=resource)
        err = _try_protect(db, spec)
        label = f"{table} (key {typ}) sharing resource {resource!r}"
        if accepted:
            findings.check(label, err is None, f"refused: {err}")
        else:
            findings.check(
                label,
                err is not None and err.sqlstate == "YF000",
                f"expected YF000, got {err.sqlstate if err else 'accepted'}",
            )
    db.rollback()
    findings.assert_clean()


@pytest.mark.parametrize(
    ("before", "after", "value"),
    [
        ("timestamptz", "timestamptz(0)", "'2020-01-01 00:00:00.6+00'"),
        ("timestamp(3)", "timestamp(1)", "'2020-01-01 00:00:00.66'"),
        ("time", "time(0)", "'10:00:00.6'"),
        ("varchar(10)", "char(10)", "'ab '"),
        ("varchar(10)", "varchar(2)", "'ab  '"),
        ("text", "varchar(2)", "'ab  '"),
    ],
)
def test_a_retype_that_changes_how_keys_print_is_refused(
    db: Conn, before: str, after: str, value: str
) -> None:
    """A retype within what looks like one type (a precision, char(n) for varchar) changes the
    text of existing keys: a stale token would meet a new, empty fence. PostgreSQL refuses the
    retype (the key fence's trigger names the column); with that trigger dropped by the owner,
    every write naming a key is refused."""
    db.execute(f"CREATE TABLE kp (id int PRIMARY KEY, k {before} NOT NULL, v int)")
    spec = FenceSpec(TableName("public", "kp"), scope=Scope.KEY, key=("k",))
    for stmt in protect_statements(spec):
        db.execute(stmt.encode())
    db.execute("SELECT set_config('fencekit.token', '100', true)")
    db.execute(f"INSERT INTO kp VALUES (1, {value}, 0)")
    db.commit()
    with pytest.raises(psycopg.Error) as refused:
        db.execute(f"ALTER TABLE kp ALTER COLUMN k TYPE {after}")
    assert refused.value.sqlstate == "0A000", refused.value
    assert "used in a trigger definition" in str(refused.value)
    db.rollback()
    db.execute(without_keys_guard("kp"))
    db.execute(f"ALTER TABLE kp ALTER COLUMN k TYPE {after}")
    db.commit()
    db.execute("SELECT set_config('fencekit.token', '50', true)")
    with pytest.raises(psycopg.Error) as info:
        db.execute("UPDATE kp SET v = 1 WHERE id = 1")
    assert info.value.sqlstate == "YF000", info.value
    db.rollback()


def test_a_collation_someone_created_cannot_key_a_fence(db: Conn) -> None:
    """The key triggers would sort a statement's keys under the key column's collation, as the
    role that ran protect: a collation the table's owner (or anyone) created is refused at
    protect. After a retype to one (past the ``_keys`` trigger), the fast path prints the keys
    in the default collation and compares nothing under the column's: the keys are judged by
    their text, and status reports the key column."""
    from fencekit import catalog

    db.execute('CREATE COLLATION public.mine FROM "C"')
    db.execute("CREATE TABLE kc1 (id int PRIMARY KEY, k text COLLATE public.mine NOT NULL)")
    db.commit()
    spec = FenceSpec(TableName("public", "kc1"), scope=Scope.KEY, key=("k",))
    err = _try_protect(db, spec)
    assert err is not None
    assert err.sqlstate == "YF000", err
    assert "not one of pg_catalog's" in str(err)
    db.rollback()
    db.execute("CREATE TABLE kc2 (id int PRIMARY KEY, k text NOT NULL, v int)")
    for stmt in protect_statements(
        FenceSpec(TableName("public", "kc2"), scope=Scope.KEY, key=("k",))
    ):
        db.execute(stmt.encode())
    db.execute("SELECT set_config('fencekit.token', '10', true)")
    db.execute("INSERT INTO kc2 VALUES (1, 'a', 0), (2, 'b', 0)")
    db.commit()
    db.execute(without_keys_guard("kc2"))
    db.execute("ALTER TABLE kc2 ALTER COLUMN k TYPE text COLLATE public.mine")
    db.commit()
    db.execute("SELECT set_config('fencekit.token', '5', true)")
    with pytest.raises(psycopg.Error) as info:
        db.execute("UPDATE kc2 SET v = 1")
    assert info.value.sqlstate == "YF001", info.value
    db.rollback()
    db.execute("SELECT set_config('fencekit.token', '11', true)")
    db.execute("UPDATE kc2 SET v = 2 WHERE id = 1")
    db.commit()
    got = db.execute("SELECT key, fence FROM fencekit.fences WHERE resource = 'public.kc2'")
    assert sorted(got.fetchall()) == [("a", 11), ("b", 10)]
    db.rollback()
    (pt,) = [p for p in catalog.protected_tables(db) if p.spec.table.name == "kc2"]
    drift = [d for d in catalog.table_drift(db, pt) if d.kind == "key_type_changed"]
    db.rollback()
    assert drift, "status does not report the key column"
    assert "not one of pg_catalog's" in drift[0].message, drift


def _ord(db: Conn) -> None:
    """Table ord partitioned by region, a column dropped from the parent (so its partition's
    columns lie otherwise), keyed on (region, k) with k a stored generated column; a view over
    it; one row written at 10 through the partition."""
    db.execute(
        "CREATE TABLE ord (legacy int, region text NOT NULL, n int NOT NULL,"
        " k bigint GENERATED ALWAYS AS (n * 10) STORED) PARTITION BY LIST (region);"
        " ALTER TABLE ord DROP COLUMN legacy;"
        " CREATE TABLE ord_eu PARTITION OF ord FOR VALUES IN ('eu');"
        " CREATE VIEW ord_v AS SELECT region, n FROM ord"
    )
    for stmt in protect_statements(
        FenceSpec(TableName("public", "ord"), scope=Scope.KEY, key=("region", "k"))
    ):
        db.execute(stmt.encode())
    db.execute("SELECT set_config('fencekit.token', '10', true)")
    db.execute("INSERT INTO ord_eu (region, n) VALUES ('eu', 1)")
    db.commit()


@pytest.mark.parametrize("through", ["the partition", "the parent"])
def test_a_generated_key_part_the_transition_table_lacks_is_refused(db: Conn, through: str) -> None:
    """An INSERT that a partitioned table routes to a partition whose columns lie otherwise (a
    column dropped from the parent is enough) shows a stored generated column as NULL in the
    parent's transition table: PostgreSQL fills it in only later. A composite key printed that
    NULL as nothing ("(eu,)"), a key of its own, so the same row had two fences and a stale
    write through the parent passed. A key with a NULL part is now refused, whichever way."""
    _ord(db)
    table = "ord_eu" if through == "the partition" else "ord"
    db.execute("SELECT set_config('fencekit.token', '5', true)")
    with pytest.raises(psycopg.Error) as info:
        db.execute(f"INSERT INTO {table} (region, n) VALUES ('eu', 1)")
    db.rollback()
    if through == "the partition":
        assert info.value.sqlstate == "YF001", info.value  # stale: its key's fence is 10
    else:
        assert info.value.sqlstate == "YF000", info.value
        assert "a key column of a key fence is NULL" in str(info.value), info.value
    keys = db.execute("SELECT key, fence FROM fencekit.fences WHERE resource = 'public.ord'")
    assert keys.fetchall() == [("(eu,10)", 10)]
    db.rollback()


WRITE_PATHS = {
    "insert": "INSERT INTO public.ord (region, n) VALUES ('eu', 1)",
    "on conflict": "INSERT INTO public.ord (region, n) VALUES ('eu', 1) ON CONFLICT DO NOTHING",
    "view": "INSERT INTO public.ord_v (region, n) VALUES ('eu', 1)",
    "copy": "COPY public.ord (region, n) FROM STDIN",
    "merge": "MERGE INTO public.ord o USING (VALUES ('eu', 1)) AS s(region, n) ON false"
    " WHEN NOT MATCHED THEN INSERT (region, n) VALUES (s.region, s.n)",
}


def _write(conn: Conn, path: str) -> None:
    if path == "copy":
        with conn.cursor().copy(WRITE_PATHS[path]) as copy:
            copy.write_row(("eu", 1))
    else:
        conn.execute(WRITE_PATHS[path])


@pytest.mark.parametrize("path", sorted(WRITE_PATHS))
def test_a_writer_cannot_reach_a_second_fence_through_the_parent(
    db: Conn, make_role: Callable[..., str], path: str
) -> None:
    """The same hole as above, as the application's role on a connection just opened with other
    settings (TimeZone, DateStyle, search_path), by every way a row reaches a partition through
    its partitioned table: INSERT, ON CONFLICT, an updatable view, COPY and MERGE. Each stale
    write is refused, and no second fence appears."""
    if path == "merge" and db.info.server_version < 150000:
        pytest.skip("MERGE is PostgreSQL 15+")
    _ord(db)
    writer = make_conninfo(
        make_role(APP, DML),
        options="-c TimeZone=Pacific/Chatham -c DateStyle=German,DMY -c search_path=pg_temp",
    )
    with psycopg.connect(writer) as conn:
        conn.execute("SELECT set_config('fencekit.token', '5', true)")
        with pytest.raises(psycopg.Error) as info:
            _write(conn, path)
    assert info.value.sqlstate == "YF000", info.value
    assert "a key column of a key fence is NULL" in str(info.value), info.value
    keys = db.execute("SELECT key, fence FROM fencekit.fences WHERE resource = 'public.ord'")
    assert keys.fetchall() == [("(eu,10)", 10)]
    db.rollback()


def test_key_type_changed_after_protect_is_caught(db: Conn) -> None:
    """A key column whose type changes names its keys differently (1 becomes 1.00): the old
    fences would no longer guard the rows. Re-protect refuses and status reports it."""
    from fencekit import catalog

    db.execute("CREATE TABLE kt (id int PRIMARY KEY, k int NOT NULL, v int)")
    spec = FenceSpec(TableName("public", "kt"), scope=Scope.KEY, key=("k",))
    for stmt in protect_statements(spec):
        db.execute(stmt.encode())
    db.execute("SELECT set_config('fencekit.token', '20', true)")
    db.execute("INSERT INTO kt VALUES (1, 1, 0)")
    db.commit()
    (pt,) = catalog.protected_tables(db)
    assert not [d for d in catalog.table_drift(db, pt) if d.kind == "key_type_changed"]
    db.execute(without_keys_guard("kt"))
    db.execute("ALTER TABLE kt ALTER COLUMN k TYPE numeric(10,2)")
    db.commit()
    drift = [d for d in catalog.table_drift(db, pt) if d.kind == "key_type_changed"]
    assert drift, "status does not report the changed key type"
    assert "numeric" in drift[0].message
    db.rollback()
    err = _try_protect(db, spec)
    assert err is not None
    assert err.sqlstate == "YF000", err
    assert "changed type" in str(err)
    db.rollback()


def test_key_text_holds_for_a_writer_with_other_settings_on_every_write_path(
    db: Conn, make_role: Callable[..., str]
) -> None:
    """The key triggers set the print settings only for keys that print by them, and only
    while they print: a date key written by a fencekit_writer member on fresh connections
    with hostile TimeZone, DateStyle and search_path, through a view, a foreign-key cascade
    that moves rows between partitions, COPY, MERGE and a definer function, names one fence
    per day (ISO text), a stale token is refused on each path, and the writer's settings are
    its own again after every statement."""
    db.execute("CREATE TABLE days (d date PRIMARY KEY)")
    db.execute("INSERT INTO days VALUES ('2020-03-04'), ('2021-05-06'), ('2022-07-08')")
    db.execute(
        "CREATE TABLE kd (id int, d date NOT NULL REFERENCES days (d) ON UPDATE CASCADE, v int)"
        " PARTITION BY RANGE (d)"
    )
    db.execute(
        "CREATE TABLE kd_2020 PARTITION OF kd FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')"
    )
    db.execute("CREATE TABLE kd_later PARTITION OF kd FOR VALUES FROM ('2021-01-01') TO (MAXVALUE)")
    db.execute("CREATE VIEW kd_view AS SELECT * FROM kd")
    db.execute(
        "CREATE FUNCTION bump(day date) RETURNS void LANGUAGE sql SECURITY DEFINER"
        " SET search_path = public AS $$ UPDATE kd SET v = v + 1 WHERE d = day $$"
    )
    for stmt in protect_statements(
        FenceSpec(TableName("public", "kd"), scope=Scope.KEY, key=("d",))
    ):
        db.execute(stmt.encode())
    db.commit()
    writer = make_role(
        "kd_writer",
        "fencekit_writer",
        "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public",
    )
    db.execute("GRANT EXECUTE ON FUNCTION bump(date) TO kd_writer")
    db.commit()
    hostile = (
        "SET TimeZone = 'Pacific/Chatham'; SET DateStyle = 'German'; SET bytea_output = 'escape';"
        " SET search_path = public, pg_catalog"
    )

    def write(token: int, *stmts: str, copy: str | None = None) -> None:
        with psycopg.connect(writer) as c:  # a connection the pool has just opened
            c.execute(hostile)
            c.commit()
            before = c.execute(
                "SELECT current_setting('DateStyle'), current_setting('TimeZone')"
            ).fetchone()
            c.execute("SELECT set_config('fencekit.token', %s, true)", [str(token)])
            for s in stmts:
                c.execute(s)
            if copy is not None:
                with c.cursor().copy("COPY kd (id, d, v) FROM STDIN") as cp:
                    cp.write(copy)
            after = c.execute(
                "SELECT current_setting('DateStyle'), current_setting('TimeZone')"
            ).fetchone()
            c.commit()
        assert after == before == ("German, DMY", "Pacific/Chatham")

    write(100, "INSERT INTO kd_view VALUES (1, '2020-03-04', 0)")
    write(101, copy="2\t2021-05-06\t0\n")
    write(
        102,
        "MERGE INTO kd USING (SELECT 3 AS id, date '2022-07-08' AS d) s ON kd.id = s.id"
        " WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.d, 0)",
    )
    write(103, "SELECT bump('2021-05-06')")
    # A cascade: the parent's key moves, the fenced rows follow it to the other partition.
    write(104, "UPDATE days SET d = '2021-03-04' WHERE d = '2020-03-04'")
    keys = dict(
        db.execute(
            "SELECT key, fence FROM fencekit.fences WHERE resource = 'public.kd' ORDER BY key"
        ).fetchall()
    )
    db.commit()
    assert keys == {
        "2020-03-04": 104,
        "2021-03-04": 104,
        "2021-05-06": 103,
        "2022-07-08": 102,
    }, keys
    for stale, stmt in (
        (101, "UPDATE kd_view SET v = 9 WHERE d = '2021-03-04'"),
        (102, "SELECT bump('2021-05-06')"),
        (101, "DELETE FROM kd WHERE d = '2022-07-08'"),
    ):
        with pytest.raises(psycopg.Error) as refused:
            write(stale, stmt)
        assert refused.value.sqlstate == "YF001", (stmt, refused.value)
