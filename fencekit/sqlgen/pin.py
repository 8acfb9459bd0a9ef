"""Run generated SQL under ``search_path = pg_catalog, pg_temp``, whoever runs it.

Operators and functions are looked up at parse time in the caller's search_path, and an
operator (or function) in a later schema whose argument types match *exactly* beats
pg_catalog's when pg_catalog's needs a cast: ``public./(bigint, numeric)`` wins over
``pg_catalog./(numeric, numeric)`` for ``bigint / 1000.0`` even with pg_catalog searched
first. Anyone with CREATE on ``public`` can plant one, and a DBA running fencekit's SQL would
run it. So nothing fencekit generates is parsed under the caller's path:

- a whole script (``fencekit sql ...``, the CLI) pins it with ``SET LOCAL`` right after
  ``BEGIN`` (:data:`SCRIPT_PIN`);
- a statement list run inside someone else's transaction (alembic and Django operations, the
  ``--no-transaction`` scripts) is bracketed by :func:`pinned`: the caller's path is saved in a
  transaction-local setting, the path pinned, the statements run, the caller's path restored.

The statement builders (``protect_statements`` ...) do not pin themselves: lists are
concatenated (a move is an unprotect plus a protect) and a pin/restore pair must not nest.
Whoever executes a list wraps it once. Views and ``CREATE TRIGGER ... WHEN`` bind their
operators when created, so creating them under the pin is enough; functions pin their own
path (``SET search_path``) or, on the hot path, qualify every operator (tests/security/
test_operator_hijack.py checks both).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["IN_TRANSACTION", "PINNED_PATH", "SCRIPT_PIN", "pinned"]

#: The only path generated SQL is parsed under: pg_catalog, then the session's temporary schema
#: last (pg_temp is never searched for functions or operators, and last for relations).
PINNED_PATH = "pg_catalog, pg_temp"

#: The statement a whole script runs right after ``BEGIN``.
SCRIPT_PIN = f"SET LOCAL search_path = {PINNED_PATH}"

_SAVED = "'fencekit.caller_search_path'::pg_catalog.text"

#: Save the caller's search_path in a transaction-local setting, then pin it (transaction-local
#: too: an error that aborts the transaction restores the caller's path by itself). Every
#: literal is cast, so even under the caller's path each call is an exact match in pg_catalog.
SAVE_AND_PIN = (
    f"SELECT pg_catalog.set_config({_SAVED},\n"
    "         pg_catalog.current_setting('search_path'::pg_catalog.text), true),\n"
    f"       pg_catalog.set_config('search_path'::pg_catalog.text, "
    f"'{PINNED_PATH}'::pg_catalog.text, true)"
)

#: Give the caller its search_path back. It refuses when the pin did not hold: outside a
#: transaction (autocommit) ``set_config(..., true)`` lasts one statement, so the statements
#: before this one ran under the caller's path; run the list in one transaction.
RESTORE = (
    "DO $pin$\n"
    "BEGIN\n"
    "  IF pg_catalog.current_setting('search_path'::pg_catalog.text)\n"
    f"     OPERATOR(pg_catalog.<>) '{PINNED_PATH}'::pg_catalog.text THEN\n"
    "    RAISE EXCEPTION USING ERRCODE = 'YF000',\n"
    "      MESSAGE = 'fencekit: search_path was not pinned while fencekit''s statements ran',\n"
    "      HINT = 'Run the statements in one transaction (set_config(..., true) lasts one '\n"
    "        'statement in autocommit).';\n"
    "  END IF;\n"
    "  PERFORM pg_catalog.set_config('search_path'::pg_catalog.text,\n"
    f"    pg_catalog.current_setting({_SAVED}), true);\n"
    "END\n"
    "$pin$"
)


#: The first statement of a pinned list: outside a transaction block (autocommit) PostgreSQL
#: refuses a SAVEPOINT with an error, before anything of fencekit's has run. Without it the pin
#: would last one statement and the rest would be parsed under the caller's path (the second
#: review's N1); RESTORE's check comes too late, once earlier statements have committed.
IN_TRANSACTION = ("SAVEPOINT fencekit_pin", "RELEASE SAVEPOINT fencekit_pin")


def pinned(statements: Iterable[str]) -> list[str]:
    """``statements`` bracketed by :data:`SAVE_AND_PIN` and :data:`RESTORE`, after a check that
    they run in a transaction block (:data:`IN_TRANSACTION`); run the result in one transaction
    (alembic's and Django's migration transaction, or your own)."""
    return [*IN_TRANSACTION, SAVE_AND_PIN, *statements, RESTORE]
