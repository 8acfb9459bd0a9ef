"""The examples in docs/getting-started.md and docs/dba-guide.md run, in document order, against
a fresh database: bash blocks with the installed `fencekit` on PATH, SQL blocks through the real
psql, Python blocks in a fresh interpreter. Each block is marked in the Markdown:

    <!-- test -->                  must succeed
    <!-- test: fails YF001 -->     must fail with that SQLSTATE (psql) or non-zero exit (bash)
    <!-- test: prints TEXT -->     must succeed and print TEXT
    <!-- no-test: reason -->       not run (e.g. pip install); the reason is required
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["docs/getting-started.md", "docs/dba-guide.md", "docs/rollout.md"]
PSQL = "/usr/bin/psql"
ROLES = [
    "app_migrator",
    "web_app",
]  # created by the DBA guide and the rollout page; roles are cluster-wide, so dropped after

_BLOCK = re.compile(
    r"(?:<!--\s*(?P<marker>no-test|test)(?::\s*(?P<arg>.*?))?\s*-->\n)?"
    r"^```(?P<lang>\w*)\n(?P<body>.*?)^```",
    re.S | re.M,
)


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    body: str
    marker: str | None
    arg: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} ({self.lang})"


def blocks(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    return [
        Block(
            doc,
            text.count("\n", 0, m.start("body")),
            m["lang"],
            m["body"],
            m["marker"],
            (m["arg"] or "").strip(),
        )
        for m in _BLOCK.finditer(text)
    ]


@pytest.mark.parametrize("doc", DOCS)
def test_every_example_is_marked(doc: str) -> None:
    found = blocks(doc)
    assert any(b.marker == "test" for b in found)
    for b in found:
        if b.lang in ("sql", "bash", "python", "sh", ""):
            assert b.marker is not None, f"{b}: mark it <!-- test --> or <!-- no-test: why -->"
        if b.marker == "no-test":
            assert b.arg, f"{b}: <!-- no-test: ... --> needs a reason"


def _run(b: Block, env: dict[str, str], cwd: Path, dsn: str) -> subprocess.CompletedProcess[str]:
    if b.lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", b.body]
    elif b.lang == "sql":
        cmd = [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", dsn]
    elif b.lang == "python":
        cmd = [sys.executable, "-c", b.body]
    else:
        raise AssertionError(f"{b}: cannot run a {b.lang!r} block")
    stdin = b.body if b.lang == "sql" else None
    return subprocess.run(
        cmd, input=stdin, env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("doc", DOCS)
def test_doc_examples_run(doc: str, raw_dsn: str, tmp_path: Path) -> None:
    if not os.path.exists(PSQL):
        pytest.skip("psql is not installed (apt-get install postgresql-client)")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "FENCEKIT_DSN": raw_dsn, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    try:
        ran = 0
        for b in blocks(doc):
            if b.marker != "test":
                continue
            r = _run(b, env, tmp_path, raw_dsn)
            shown = f"{b}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
            if b.arg.startswith("fails"):
                assert r.returncode != 0, f"expected a failure: {shown}"
                code = b.arg.removeprefix("fails").strip()
                assert code in r.stderr, shown
            else:
                assert r.returncode == 0, shown
            if b.arg.startswith("prints"):
                assert b.arg.removeprefix("prints").strip() in r.stdout, shown
            ran += 1
        assert ran >= 3
    finally:
        with psycopg.connect(raw_dsn, autocommit=True) as conn:
            for role in ROLES:
                if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                    conn.execute(f"DROP OWNED BY {role}")
                    conn.execute(f"DROP ROLE {role}")
