#!/usr/bin/env python3
"""Write the sync form of each asyncio module that has one, so a pair is written once.

As psycopg does for its own sync classes (its ``tools/async_to_sync.py`` works on the AST;
these modules are small enough for a line-wise rewrite that keeps comments): ``async def``,
``async with`` and ``async for`` lose ``async``, ``await`` goes, and the names in each pair's
table become their sync twins. The output's imports are sorted, and it is formatted with
ruff. ``--check`` writes nothing and fails when a generated file differs from what its source gives
(``tests/leases/test_generated.py`` runs it).

    python scripts/async_to_sync.py           # rewrite every generated file
    python scripts/async_to_sync.py --check   # exit 1 when one has drifted
    python scripts/async_to_sync.py --check --root DIR   # a copy of the tree (the tests)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (async source, sync output, [(async spelling, sync spelling), ...]): whole words, in order.
PAIRS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "fencekit/leases/_postgres_async.py",
        "fencekit/leases/_postgres_sync.py",
        [
            ("asyncio form", "sync form"),
            ("AsyncPostgresIssuer", "PostgresIssuer"),
            ("psycopg.AsyncConnection.connect", "psycopg.connect"),
            ("psycopg.AsyncConnection", "psycopg.Connection"),
            ("import asyncio", "import threading"),
            ("asyncio.Lock", "threading.Lock"),
            ("__aenter__", "__enter__"),
            ("__aexit__", "__exit__"),
        ],
    ),
    (
        "fencekit/_psycopg_async.py",
        "fencekit/_psycopg_sync.py",
        [
            ("asyncio form", "sync form"),
            ("_async_fence_before", "_fence_before"),
            ("AsyncFencedCursor", "FencedCursor"),
            ("AsyncFencedServerCursor", "FencedServerCursor"),
            ("_AsyncTokenTransaction", "_TokenTransaction"),
            ("_async_nested_transaction", "_nested_transaction"),
            ("async_transaction", "transaction"),
            ("async_set_token", "set_token"),
            ("_internals.async_begin", "_internals.begin"),
            ("psycopg.AsyncConnection", "psycopg.Connection"),
            ("psycopg.AsyncCursor", "psycopg.Cursor"),
            ("psycopg.AsyncServerCursor", "psycopg.ServerCursor"),
            ("psycopg.AsyncTransaction", "psycopg.Transaction"),
            ("AbstractAsyncContextManager", "AbstractContextManager"),
            ("asynccontextmanager", "contextmanager"),
            ("AsyncIterator", "Iterator"),
            ("super().__aenter__", "super().__enter__"),
            ("super().__aexit__", "super().__exit__"),
            ("__aenter__", "__enter__"),
            ("__aexit__", "__exit__"),
        ],
    ),
]

_ASYNC = re.compile(r"\basync (def|with|for)\b")
_AWAIT = re.compile(r"\bawait ")


def render(source: str, renames: list[tuple[str, str]], name: str, root: Path = ROOT) -> str:
    text = _AWAIT.sub("", _ASYNC.sub(r"\1", source))
    for old, new in renames:
        text = re.sub(rf"(?<![\w.]){re.escape(old)}\b", new, text)
    # The source's docstring says how to regenerate; the output's, that it is generated.
    end = text.index('"""', 3) + 3
    summary = text[3:end].split("\n", 1)[0].split(":", 1)[0].rstrip(".")
    text = (
        f'"""{summary}.\n\nGenerated from ``{name}``\nby ``scripts/async_to_sync.py``: '
        f'edit that file, not this one.\n"""' + text[end:]
    )
    # A rename can unsort an import line: ruff's isort fix puts it back in order.
    for command in (
        ["check", "--fix", "--exit-zero", "--quiet", "--select", "I"],
        ["format"],
    ):
        text = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--stdin-filename", "generated.py", "-"],
            input=text,
            capture_output=True,
            text=True,
            check=True,
            cwd=root,  # its pyproject.toml: the project's ruff settings
        ).stdout
    return text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    root = Path(argv[argv.index("--root") + 1]) if "--root" in argv else ROOT
    drifted = []
    for source, target, renames in PAIRS:
        want = render((root / source).read_text(), renames, source, root)
        path = root / target
        if check:
            if not path.exists() or path.read_text() != want:
                drifted.append(target)
        else:
            path.write_text(want)
    for target in drifted:
        print(f"{target} is not what scripts/async_to_sync.py generates: run it", file=sys.stderr)
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
