"""FenceError translation from real rejections, client-side validation, import hygiene."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from fencekit import errors
from fencekit.errors import (
    SQLSTATES,
    FenceError,
    MalformedTokenError,
    MissingTokenError,
    StaleTokenError,
    translate,
    validate_token,
)
from tests.adapters.conftest import connect_kwargs


@pytest.mark.parametrize("token", [1, 34, 2**63 - 1])
def test_valid_tokens(token: int) -> None:
    assert validate_token(token) == token


@pytest.mark.parametrize(
    ("token", "words"),
    [
        (True, "must be an int"),
        (False, "must be an int"),
        ("34", "must be an int"),
        (34.0, "must be an int"),
        (None, "must be an int"),
        (0, "positive"),
        (-5, "positive"),
        (2**63, "bigint"),
    ],
)
def test_invalid_tokens(token: object, words: str) -> None:
    with pytest.raises(MalformedTokenError, match=words):
        validate_token(token)
    # One name per concept: the client-side refusal is the database's reason, before sending.
    assert issubclass(MalformedTokenError, FenceError)
    assert MalformedTokenError.sqlstate == "YF004"


def test_one_class_per_sqlstate_in_contract() -> None:
    assert sorted(SQLSTATES) == [f"YF00{i}" for i in range(8)]
    assert {c.reason for c in SQLSTATES.values()} >= {"stale", "missing", "malformed"}
    assert all(issubclass(c, FenceError) for c in SQLSTATES.values())


def _stale_error(dsn: str) -> psycopg.Error:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT set_config('fencekit.token', '34', true)")
        conn.execute("UPDATE billing_summary SET summary = 'B' WHERE account_id = 42")
        conn.commit()
        conn.execute("SELECT set_config('fencekit.token', '33', true)")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("UPDATE billing_summary SET summary = 'A' WHERE account_id = 42")
    return info.value


def test_psycopg_raises_fencekit_classes(billing: str) -> None:
    """psycopg itself raises the registered class: a StaleTokenError and a psycopg error, with
    no adapter installed (a plain psycopg connection)."""
    err = _stale_error(billing)
    assert isinstance(err, StaleTokenError)
    assert isinstance(err, psycopg.DatabaseError)
    assert isinstance(err, errors.FencekitError)
    # Never one of the classes retry loops treat as retryable.
    assert not isinstance(err, psycopg.errors.SerializationFailure | psycopg.OperationalError)
    assert psycopg.errors.lookup("YF001") is type(err)
    assert (err.sqlstate, err.reason) == ("YF001", "stale")
    assert err.table == "public.billing_summary"
    assert err.key == {"account_id": "42"}
    assert (err.token, err.fence) == (33, 34)
    assert err.column == "account_id"  # a key fence names its first key column
    assert err.diag.sqlstate == "YF001"  # psycopg's own fields stay
    assert err.orig is err
    assert translate(err) is err
    assert "33" in str(err)
    assert "34" in str(err)
    assert err.as_dict()["fence"] == 34


def test_registered_errors_pickle(billing: str) -> None:
    import pickle

    err = _stale_error(billing)
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err)
    assert (copy.table, copy.token, copy.fence) == (err.table, 33, 34)


def test_translate_sqlalchemy_wrapped(billing: str) -> None:
    from sqlalchemy.exc import DBAPIError

    exc = _stale_error(billing)
    wrapped = DBAPIError.instance("UPDATE ...", {}, exc, psycopg.Error)
    assert wrapped.orig is exc
    assert translate(wrapped) is exc


def test_translate_psycopg2(billing: str) -> None:
    """psycopg2 cannot be taught new classes: translate() reads its pgcode and diag."""
    import psycopg2

    _stale_error(billing)  # the fence is 34
    with psycopg2.connect(billing) as conn, conn.cursor() as cur:
        cur.execute("SELECT set_config('fencekit.token', '33', true)")
        with pytest.raises(psycopg2.Error) as info:
            cur.execute("UPDATE billing_summary SET summary = 'A' WHERE account_id = 42")
    conn.close()
    err = translate(info.value)
    assert isinstance(err, StaleTokenError)
    assert err.table == "public.billing_summary"
    assert err.key == {"account_id": "42"}
    assert (err.token, err.fence) == (33, 34)
    assert err.column == "account_id"
    assert err.orig is info.value
    assert err.__cause__ is info.value


async def test_translate_asyncpg(billing: str) -> None:
    """asyncpg sets the diagnostics on the error itself: translate() reads them there."""
    import asyncpg

    conn = await asyncpg.connect(**connect_kwargs(billing))
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('fencekit.token', '0', true)")
            with pytest.raises(asyncpg.PostgresError) as info:
                await conn.execute("DELETE FROM billing_summary")
    except asyncpg.PostgresError:
        pass
    finally:
        await conn.close()
    err = translate(info.value)
    assert isinstance(err, MalformedTokenError)
    assert err.table == "public.billing_summary"
    assert err.orig is info.value


def test_missing_token_message_is_actionable(billing: str) -> None:
    with psycopg.connect(billing) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute("DELETE FROM billing_summary")
    err = translate(info.value)
    assert isinstance(err, MissingTokenError)
    assert err.table == "public.billing_summary"
    assert "fencing" in str(err)
    assert "fencing(token)" in MissingTokenError.advice


def test_missing_token_hint_tells_no_scope_from_a_connection_that_sent_nothing(
    billing: str,
) -> None:
    import fencekit.psycopg
    from fencekit import fencing

    # The adapter is installed, but the write runs outside any lease or fencing() scope.
    with psycopg.connect(billing) as conn:
        fencekit.psycopg.install(conn)
        with pytest.raises(MissingTokenError) as outside:
            conn.execute("DELETE FROM billing_summary")
    assert "outside any lease or fencing() scope" in str(outside.value.hint)
    assert "install" not in str(outside.value.hint).split(".")[0]
    # A token is current, but this connection has no adapter to send it.
    with (
        psycopg.connect(billing) as conn,
        fencing(77),
        pytest.raises(MissingTokenError) as unsent,
    ):
        conn.execute("DELETE FROM billing_summary")
    assert "token 77 was current here" in str(unsent.value.hint)
    assert "install the driver's adapter" in str(unsent.value.hint)
    # psql users still get the database's own hint.
    assert "set_config('fencekit.token'" in unsent.value.orig.diag.message_hint  # type: ignore[union-attr]


def test_other_errors_are_not_translated(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.Error) as info:
        db.execute("SELECT 1/0")
    assert translate(info.value) is None
    assert translate(ValueError("x")) is None


def test_errors_module_imports_without_drivers() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, *a):\n"
        "        if name.split('.')[0] in ('psycopg', 'sqlalchemy'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import fencekit.errors, fencekit.context, fencekit.metrics\n"
        "assert 'psycopg' not in sys.modules and 'sqlalchemy' not in sys.modules\n"
        "with fencekit.context.fencing(3): assert fencekit.context.current_token() == 3\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert errors.__all__


def test_every_fencekit_exception_has_one_root() -> None:
    """Every exception class defined under fencekit/ derives from FencekitError."""
    import importlib
    import inspect
    import pkgutil

    import fencekit

    optional = ("fencekit.alembic_plugin", "fencekit._alembic_entry")
    found = []
    for info in pkgutil.walk_packages(fencekit.__path__, "fencekit."):
        if info.name.startswith(optional) or info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency this environment lacks
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("fencekit"):
                found.append(cls)
    assert len(found) > 20
    assert [c for c in found if not issubclass(c, errors.FencekitError)] == []
    names = {c.__name__ for c in found}
    assert all(n.endswith("Error") for n in names), sorted(
        n for n in names if not n.endswith("Error")
    )


@pytest.mark.parametrize("sqlstate", sorted(SQLSTATES))
def test_psycopg_raises_every_reason_as_fencekits(db: psycopg.Connection, sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        db.execute(
            f"DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '{sqlstate}', "
            "TABLE = 'billing_summary', SCHEMA = 'public'; END $$"
        )
    err = info.value
    assert isinstance(err, SQLSTATES[sqlstate])
    assert (err.sqlstate, err.message, err.table) == (sqlstate, "refused", "public.billing_summary")
