"""The ```python blocks of the adapter docs pages run, in order, against a fresh database.

Each page runs in one namespace seeded with ``dsn`` (libpq conninfo), ``pg_url`` (the same as a
``postgresql://`` URL) and ``url`` (SQLAlchemy)
of a database where ``billing_summary`` is protected as getting-started.md does it (key
fence on account_id) and holds account 42.
Blocks in other languages (```text, ```bash) are prose only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.adapters.conftest import sa_url

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = [
    "context.md",
    "psycopg.md",
    "psycopg2.md",
    "asyncpg.md",
    "sqlalchemy.md",
    "errors-and-metrics.md",
]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def conninfo_url(dsn: str) -> str:
    """``dsn`` as a ``postgresql://`` URL that libpq and asyncpg read alike (socket hosts too)."""
    from urllib.parse import quote, urlencode

    import psycopg

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    query = {k: str(params[k]) for k in ("host", "port") if params.get(k)}
    user = quote(str(params.get("user") or "postgres"))
    password = f":{quote(str(params['password']))}" if params.get("password") else ""
    return f"postgresql://{user}{password}@/{quote(str(params['dbname']))}?{urlencode(query)}"


def python_blocks(page: str) -> list[str]:
    return BLOCK.findall((DOCS / page).read_text())


@pytest.mark.parametrize("page", PAGES)
def test_doc_examples_run(page: str, billing: str) -> None:
    if page == "sqlalchemy.md":
        pytest.importorskip("greenlet", reason="the asyncio example needs SQLAlchemy[asyncio]")
    blocks = python_blocks(page)
    assert blocks, f"docs/{page} has no ```python example"
    if page in ("psycopg2.md", "asyncpg.md"):
        pytest.importorskip(page.removesuffix(".md"))
    # pg_url: the database as a plain postgresql:// URL (asyncpg takes no libpq conninfo).
    pg_url = conninfo_url(billing)
    namespace: dict[str, object] = {
        "dsn": billing,
        "url": sa_url(billing),
        "pg_url": pg_url,
        "__name__": "docs",
    }
    for number, code in enumerate(blocks, 1):
        try:
            # dont_inherit: run as a user would, without this module's `from __future__` flags.
            block = compile(code, f"docs/{page} block {number}", "exec", dont_inherit=True)
            exec(block, namespace)  # noqa: S102
        except Exception as exc:
            raise AssertionError(f"docs/{page}, python block {number} failed: {exc!r}") from exc
