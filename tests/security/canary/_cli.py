"""Canary matrix: every CLI command, from the CLI's own parser, run as a superuser and as a
fencekit_admin member (``test_cli_as_*``: one module per role, so the two run on different
workers), each writing command in a fresh copy of the planted database. No planted canary may
run as anyone but the owner or the writer."""

from __future__ import annotations

import contextlib
import io

from fencekit.cli import main
from tests.security.canary._builders import CLI_ARGS, READ_ONLY, cli_commands
from tests.security.canary._cells import Matrix
from tests.security.canary.conftest import Planted


def _run_cli(argv: list[str]) -> None:
    # a refusal is fine: what ran before it is the point
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.suppress(Exception),
    ):
        main(argv)


def run_cli_commands(planted: Planted, role: str) -> None:
    matrix = Matrix()
    commands = cli_commands()
    missing = [c for c in commands if c not in CLI_ARGS]
    assert not missing, (
        f"CLI commands with no argument builder: {missing}; add one to CLI_ARGS in "
        "tests/security/canary/_builders.py"
    )
    user = None if role == "superuser" else planted.admin
    with planted.fresh() as shared:
        for command in commands:
            # a command that writes gets a copy of its own; the others share one
            with contextlib.ExitStack() as stack:
                db = shared if command in READ_ONLY else stack.enter_context(planted.fresh())
                dsn = planted.dsn(db, user)
                for argv in CLI_ARGS[command](dsn):
                    before = planted.hits(db)
                    _run_cli(argv)
                    shown = " ".join(a for a in argv if a not in (dsn, "--dsn"))
                    matrix.judge(f"fencekit {shown} as {role}", before, planted.hits(db))
    matrix.assert_clean()
