"""A live holder refused because the fence is ahead of the issuer is told so.

fencekit's own issuer never repeats a token, so a stale token that is a live lease of it is the
current holder's: the fence got ahead of the issuer (it was restored or reset, or another
issuer fed the resource). The rejection names that, and the repair, instead of "a newer holder
took over"; an ordinary stale write still reads as one.
"""

from __future__ import annotations

from tests.core.helpers import STALE, Conn, one, protect, reject, write


def test_a_live_holder_behind_the_fence_is_told_the_fence_is_ahead(db: Conn) -> None:
    db.execute("CREATE TABLE summary (account_id bigint PRIMARY KEY, total bigint)")
    db.commit()
    protect(db, "summary", "key", key=("account_id",))
    token = one(db, "SELECT fencekit.acquire('billing:42', 'worker-a', '1 minute')")
    # The fence gets ahead of the issuer: a write under a token the issuer never granted.
    write(db, token + 100, "INSERT INTO summary VALUES (42, 1)")
    err = reject(db, STALE, token, "UPDATE summary SET total = 2 WHERE account_id = 42")
    diag = err.diag
    assert "yet it is the live lease of billing:42" in (diag.message_primary or "")
    hint = diag.message_hint or ""
    assert "The fence is ahead of the issuer" in hint, hint
    assert f"fencekit fence set public.summary --key 42 --to {token} --allow-lower" in hint, hint
    assert "A newer holder took over" not in hint


def test_an_ordinary_stale_write_still_names_a_newer_holder(db: Conn) -> None:
    db.execute("CREATE TABLE summary (account_id bigint PRIMARY KEY, total bigint)")
    db.commit()
    protect(db, "summary", "key", key=("account_id",))
    write(db, 50, "INSERT INTO summary VALUES (42, 1)")
    err = reject(db, STALE, 40, "UPDATE summary SET total = 2 WHERE account_id = 42")
    assert "A newer holder took over" in (err.diag.message_hint or "")
    assert "ahead of the issuer" not in (err.diag.message_hint or "")
