"""The ``fencekit`` command.

Each subcommand group is a module ``fencekit/cli/<name>.py`` exposing ``register(subparsers)``;
its handlers are set with ``set_defaults(func=...)`` (optionally ``prog=parser.prog`` for error
messages) and return the exit code. The groups are
imported only when ``main`` runs, one by one, so a group whose optional dependency is not
installed (or which is not written yet) leaves the others working.

Exit codes: 0 ok, 1 failure, 2 usage error. Errors are one line on stderr; ``--debug`` shows
the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from typing import Any, NoReturn

from fencekit.cli.printable import printable_output
from fencekit.errors import UsageError

__all__ = ["main"]

#: Subcommand modules, in the order ``fencekit --help`` lists them.
GROUPS = (
    "install",
    "uninstall",
    "sql",
    "protect",
    "unprotect",
    "rename",
    "auto_cover",
    "status",
    "rollout",
    "allow",
    "move",
    "fences",
    "monitoring",
    "demo",
    "dev_server",
    "alembic",
    "bench",
    "chaos",
)

# Third-party module -> the extra that installs it.
_EXTRAS = {
    "sqlalchemy": "sqlalchemy",
    "alembic": "alembic",
    "psycopg_pool": "pool",
    "etcd3gw": "etcd",
    "kazoo": "zookeeper",
    "prometheus_client": "prometheus",
    "opentelemetry": "otel",
    "pgserver": "embedded",
    "pglast": "ddl",
}


class HelpFormatter(argparse.HelpFormatter):
    """Wraps each paragraph of a description on its own; keeps indented lines (examples)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            if para.startswith(" ") or "\n  " in para:
                out.append("\n".join(indent + line for line in para.splitlines()))
            else:
                out.append(
                    textwrap.fill(
                        " ".join(para.split()),
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                    )
                )
        return "\n\n".join(out)


class _Parser(argparse.ArgumentParser):
    """One-line usage errors that point at the right ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def _unavailable(subparsers: Any, name: str, reason: str) -> None:
    """A stand-in subcommand that explains why the real one cannot load."""
    p = subparsers.add_parser(name, help=f"(unavailable: {reason})", description=reason)
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def run(_args: argparse.Namespace) -> int:
        print(f"fencekit {name}: {reason}", file=sys.stderr)
        return 1

    p.set_defaults(func=run)


def _load_groups(subparsers: Any) -> None:
    for name in GROUPS:
        module_name = f"{__name__}.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # not written (or not shipped) yet
            top = (exc.name or "").split(".")[0]
            if top in _EXTRAS:
                _unavailable(
                    subparsers,
                    name,
                    f"needs the Python package {top!r}: pip install 'pg-fencekit[{_EXTRAS[top]}]'",
                )
                continue
            raise
        module.register(subparsers)


def build_parser() -> argparse.ArgumentParser:
    from fencekit import __version__

    parser = _Parser(
        prog="fencekit",
        description="Make PostgreSQL itself reject stale writes with fencing tokens.",
        epilog="Every subcommand has its own help, e.g.: fencekit sql protect --help",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"fencekit {__version__}",
        help="show the version and exit; with --dsn DSN (and --json) also the fencekit core "
        "installed in that database and the templates its protected tables use",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback when a command fails"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _load_groups(subparsers)
    return parser


def _one_line(exc: BaseException) -> str:
    """A driver error's primary message (and hint), else the exception text, on one line."""
    from fencekit.errors import CatalogError

    if isinstance(exc, CatalogError):
        from fencekit.cli.hints import error_text

        return " ".join(error_text(exc).split())
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary or str(exc) or type(exc).__name__
    hint = getattr(diag, "message_hint", None)
    if hint:
        text = f"{text} (hint: {hint})"
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    """Run the ``fencekit`` command; returns the exit code."""
    with printable_output():  # text from the database never reaches the terminal raw
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args_list and ("--dsn" in args_list or "--json" in args_list):
        return _version(args_list)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(args_list)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    prog = getattr(args, "prog", None) or f"fencekit {args.command}"
    if extra:
        print(
            f"{prog}: error: unrecognized arguments: {' '.join(extra)} (see: {prog} --help)",
            file=sys.stderr,
        )
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:
        if args.debug:
            raise
        print(f"{prog}: error: {exc} (see: {prog} --help)", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # An option whose optional dependency is missing (--from-ddl reads SQL with pglast).
        top = (exc.name or "").split(".")[0]
        if args.debug or top not in _EXTRAS:
            raise
        print(
            f"{prog}: error: needs the Python package {top!r}: "
            f"pip install 'pg-fencekit[{_EXTRAS[top]}]'",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:
        if args.debug or not _expected(exc):
            raise
        if args.command == "fences" and _bad_key_value(exc):
            print(
                f"{prog}: error: --key {' '.join(getattr(args, 'key', None) or [])} does not fit "
                f"the table's key columns: {_one_line(exc)} (see: {prog} --help)",
                file=sys.stderr,
            )
            return 2
        print(f"{prog}: error: {_one_line(exc)}{_needs_admin(args.command, exc)}", file=sys.stderr)
        return 1


# Commands that read fencekit's own tables (fencekit.fences, the registry), which only members
# of fencekit_admin may read: a permission error there means the role is not one.
_ADMIN_READS = ("status", "fences")


def _needs_admin(command: str, exc: Exception) -> str:
    """What to add to a permission error of a command that needs fencekit_admin."""
    if command not in _ADMIN_READS or getattr(exc, "sqlstate", None) != "42501":
        return ""
    return (
        f"; fencekit {command} reads fencekit's own tables, which only members of "
        "fencekit_admin may read: run it as one (GRANT fencekit_admin TO <role>)"
    )


def _bad_key_value(exc: Exception) -> bool:
    """A --key value the key column's type refused (class 22: data exception)."""
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state.startswith("22")


def _version(args_list: list[str]) -> int:
    """``fencekit --version --dsn DSN [--json]``: the package, the core installed in that
    database and the templates its tables use (plain ``--version`` is argparse's)."""
    import json

    from fencekit.cli.version import format_version, version_report

    p = _Parser(prog="fencekit --version", add_help=False)
    p.add_argument("--version", action="store_true")
    p.add_argument("--dsn")
    p.add_argument("--json", action="store_true")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(args_list)
    try:
        report = version_report(args.dsn)
    except UsageError as exc:
        print(f"fencekit --version: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.debug or not _expected(exc):
            raise
        print(f"fencekit --version: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        sys.stdout.write(format_version(report))
    return 0


def _expected(exc: Exception) -> bool:
    """Errors a user can act on (printed as one line); anything else is a bug (traceback)."""
    import psycopg

    from fencekit.errors import CatalogError, DdlError, FenceError, SpecError

    return isinstance(exc, (FenceError, SpecError, DdlError, CatalogError, OSError, psycopg.Error))
