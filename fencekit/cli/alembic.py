"""``fencekit alembic init DIR``: start an alembic project ready for fenced migrations."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``fencekit alembic ...`` to the CLI's subcommands."""
    parser = subparsers.add_parser(
        "alembic",
        help="alembic integration: start a migration project wired for fencekit",
        description="alembic integration (needs: pip install 'pg-fencekit[alembic]').",
    )
    commands = parser.add_subparsers(dest="alembic_command", metavar="COMMAND", required=True)
    init = commands.add_parser(
        "init",
        help="create an alembic environment in DIR wired for fencekit",
        description="Create an alembic environment in DIR (env.py wired for fencekit: fence "
        "operations, autogenerate of fences, filters) and an alembic.ini next to it.",
    )
    init.add_argument("directory", metavar="DIR", help="where the migration scripts will live")
    init.add_argument(
        "-c",
        "--config",
        default="alembic.ini",
        help="the alembic.ini to write (default: %(default)s; kept if it exists)",
    )
    init.add_argument(
        "--metadata",
        metavar="MODULE:ATTR",
        help="your models' MetaData, written into alembic.ini as target_metadata "
        "(e.g. myapp.models:Base.metadata)",
    )
    init.add_argument("--url", help="the database URL written into alembic.ini")
    init.set_defaults(func=run_init)


def run_init(args: argparse.Namespace) -> int:
    try:
        from alembic import command
        from alembic.config import Config
        from alembic.util import CommandError
    except ImportError:
        print(
            "fencekit alembic init needs alembic: pip install 'pg-fencekit[alembic]'",
            file=sys.stderr,
        )
        return 2
    from fencekit.alembic_plugin.templates import TEMPLATE_NAME, templates_root

    root = str(templates_root())

    class _Config(Config):
        def get_template_directory(self) -> str:
            return root

    ini = Path(args.config)
    existed = ini.exists()
    config = _Config(str(ini))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            command.init(config, args.directory, template=TEMPLATE_NAME)
    except CommandError as exc:
        sys.stdout.write(out.getvalue())
        print(f"fencekit alembic init: {exc}", file=sys.stderr)
        return 1
    # alembic's own "Please edit ... before proceeding" would ask for what is set below.
    sys.stdout.write(
        "".join(
            line
            for line in out.getvalue().splitlines(keepends=True)
            if not line.startswith("Please edit")
        )
    )
    given = {"target_metadata": args.metadata, "sqlalchemy.url": args.url}
    if not existed:
        _set_options(ini, given)
    unset = [key for key, value in given.items() if existed or not value]
    todo = f"set {' and '.join(unset)} in {ini}, " if unset else ""
    print(
        f"Next: {todo}declare fences on your tables (fencekit.declare), then run: "
        "alembic revision --autogenerate -m 'fences'"
    )
    return 0


def _set_options(ini: Path, values: dict[str, str | None]) -> None:
    """Fill ``key = value`` lines of the [alembic] section, keeping the file's comments."""
    lines = ini.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        key = line.split("=", 1)[0].strip()
        value = values.get(key)
        if "=" in line and not line.lstrip().startswith("#") and value:
            # configparser interpolates %: a literal % in a URL must be doubled.
            lines[i] = f"{key} = {value.replace('%', '%%')}\n"
    ini.write_text("".join(lines))
