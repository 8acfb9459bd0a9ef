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
    InvalidTokenError,
    MissingTokenError,
    StaleTokenError,
    translate,
    validate_token,
)


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
    with pytest.raises(InvalidTokenError, match=words):
        validate_token(token)
    assert issubclass(InvalidTokenError, ValueError)


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


def test_translate_real_stale_rejection(billing: str) -> None:
    exc = _stale_error(billing)
    # psycopg does not know class YF: a plain DatabaseError, never a retryable one.
    assert type(exc) is psycopg.DatabaseError
    err = translate(exc)
    assert isinstance(err, StaleTokenError)
    assert (err.sqlstate, err.reason) == ("YF001", "stale")
    assert err.table == "public.billing_summary"
    assert err.key == {"account_id": "42"}
    assert (err.token, err.fence) == (33, 34)
    assert err.column == "account_id"  # a key fence names its first key column
    assert err.orig is exc
    assert err.__cause__ is exc
    assert "33" in str(err)
    assert "34" in str(err)


def test_translate_sqlalchemy_wrapped(billing: str) -> None:
    from sqlalchemy.exc import DBAPIError

    exc = _stale_error(billing)
    wrapped = DBAPIError.instance("UPDATE ...", {}, exc, psycopg.Error)
    err = translate(wrapped)
    assert isinstance(err, StaleTokenError)
    assert err.orig is exc
    assert err.__cause__ is wrapped


def test_missing_token_message_is_actionable(billing: str) -> None:
    with psycopg.connect(billing) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute("DELETE FROM billing_summary")
    err = translate(info.value)
    assert isinstance(err, MissingTokenError)
    assert err.table == "public.billing_summary"
    assert "fencing" in str(err)
    assert "fencing(token)" in MissingTokenError.advice


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
