"""Writes of the fence column: a statement that sets ``fencekit_fence`` itself.

An UPDATE that sets the fence column (to its own token, ``SET fencekit_fence = DEFAULT``, or to
anything else) meets the same row check as any other, and is attacked as a class: a writer
chooses the token text, the row's old fence, the value it assigns to the fence column and the
form of the assignment; under both on_equal policies the statement must end exactly as the
full check would end it (the same SQLSTATE, or success), and on success the row's fence must
be the token. The oracle is computed in Python from the rules, not read from
the database; the same write without the assignment is run alongside as a second opinion.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fencekit.spec import FenceSpec, TableName
from tests.security.conftest import APP, DML, Conn, outcome, protect

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

STALE, REUSED, MISSING, MALFORMED = "YF001", "YF002", "YF003", "YF004"
BIGINT_MAX = 2**63 - 1

# Token texts a writer may present: canonical numbers around the old fence, and spellings the
# database must refuse (leading zeros, signs, spaces, exponent, too large, empty).
_numbers = st.integers(min_value=1, max_value=40) | st.sampled_from(
    [10**18 - 1, 10**18, BIGINT_MAX]
)
_texts = st.one_of(
    _numbers.map(str),
    _numbers.map(lambda n: "0" + str(n)),
    _numbers.map(lambda n: "+" + str(n)),
    _numbers.map(lambda n: " " + str(n)),
    _numbers.map(lambda n: str(n) + " "),
    st.sampled_from(["", "0", "-5", "1e3", str(BIGINT_MAX + 1), "abc", "٣"]),
)
# What the statement assigns to the fence column: the token's own value, something else, NULL.
_assign = st.sampled_from(["token", "token+1", "token-1", "fence", "null", "default", "99"])


def _canonical(text: str) -> int | None:
    """The token as fencekit reads it: a canonical positive bigint, else None (malformed)."""
    if not text.isascii() or not text.isdigit() or text.startswith("0"):
        return None
    value = int(text)
    return value if 0 < value <= BIGINT_MAX else None


def _expected(token: str | None, old: int | None, on_equal: str) -> str | None:
    """How the full row check ends an UPDATE of a row whose fence is ``old``."""
    if token is None or token == "":
        return MISSING
    value = _canonical(token)
    if value is None:
        return MALFORMED
    if old is None:
        return None
    if value > old:
        return None
    if value == old:
        return None if on_equal == "accept" else REUSED
    return STALE


def _assignment(kind: str, token: str | None) -> str:
    value = _canonical(token or "")
    if kind == "null":
        return "NULL"
    if kind == "default":
        return "DEFAULT"
    if kind == "fence":
        return "fencekit_fence"
    if kind == "99":
        return "99"
    if value is None:
        # No number to compute with: assign the text itself (a cast error is not a pass).
        return "NULLIF(current_setting('fencekit.token', true), '')::bigint"
    delta = {"token": 0, "token+1": 1, "token-1": -1}[kind]
    return str(max(1, min(BIGINT_MAX, value + delta)))


@pytest.mark.parametrize("on_equal", ["accept", "reject"])
def test_an_update_of_the_fence_column_ends_as_the_full_check_would(
    db: Conn, make_role: Any, on_equal: str
) -> None:
    db.execute("CREATE TABLE acct (id int PRIMARY KEY, balance int NOT NULL)")
    db.execute("INSERT INTO acct VALUES (1, 0)")
    protect(db, FenceSpec(TableName("public", "acct"), on_equal=on_equal))
    db.commit()
    make_role(APP, DML)
    failures: list[str] = []

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        derandomize=True,
    )
    @given(
        token=st.none() | _texts,
        old=st.none() | st.integers(min_value=1, max_value=40),
        assign=_assign,
        as_app=st.booleans(),
    )
    # The cases that matter most, whatever the draw: a stale token assigned as the fence, the
    # fence's own token (on_equal), a non-canonical spelling, no token, the column default.
    @example(token="5", old=10, assign="token", as_app=True)
    @example(token="10", old=10, assign="token", as_app=True)
    @example(token="10", old=10, assign="fence", as_app=False)
    @example(token="0020", old=10, assign="token", as_app=True)
    @example(token=" 20", old=10, assign="default", as_app=True)
    @example(token=None, old=10, assign="99", as_app=True)
    @example(token="20", old=10, assign="default", as_app=True)
    @example(token="5", old=None, assign="token-1", as_app=False)
    def attack(token: str | None, old: int | None, assign: str, as_app: bool) -> None:
        db.rollback()
        db.execute("SELECT set_config('fencekit.bypass', 'on', true)")
        db.execute("UPDATE acct SET fencekit_fence = %s WHERE id = 1", (old,))
        db.commit()
        want = _expected(token, old, on_equal)
        role = APP if as_app else None
        label = f"token={token!r} old fence={old} SET fencekit_fence = {assign}, role={role}"
        coop = outcome(
            db,
            f"UPDATE acct SET balance = balance + 1, fencekit_fence = {_assignment(assign, token)}"
            " WHERE id = 1",
            token=token,
            role=role,
        )
        if coop.ok:
            db.execute("RESET ROLE")
            fence = db.execute("SELECT fencekit_fence FROM acct WHERE id = 1").fetchone()
            db.rollback()
            if want is not None:
                failures.append(f"{label}: succeeded, but the full check says {want}")
            elif fence is None or fence[0] != _canonical(token or ""):
                failures.append(f"{label}: succeeded with fence {fence}, not the token")
        elif want is None and coop.sqlstate not in ("22003", "22P02"):
            # Out of range or invalid text in the statement's own expression is its own error.
            failures.append(f"{label}: refused with {coop}, but the full check accepts")
        elif want is not None and coop.sqlstate != want and coop.sqlstate not in ("22003", "22P02"):
            failures.append(f"{label}: refused with {coop}, the full check says {want}")
        plain = outcome(
            db, "UPDATE acct SET balance = balance + 1 WHERE id = 1", token=token, role=role
        )
        db.rollback()
        if plain.sqlstate != want:
            failures.append(f"{label}: the plain write ended {plain}, the oracle says {want}")

    attack()
    assert failures == [], "\n".join(failures[:40])
