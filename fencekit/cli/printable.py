"""What a command prints, with control characters escaped.

Names and text a command prints come from the database: a trigger's name, a writer's
``application_name``, a statement's text. Any role that can name something can put a terminal
control sequence in it, which would redraw what the screen shows (a drift line moved out of
sight, "enforced" printed over a refusal). Every command's standard output and error go through
:class:`Printable`: newline and tab pass, every other character that is not printable
(``str.isprintable``: C0 and C1 controls, bidirectional overrides, ...) is written as its
Python escape. JSON output is unchanged in meaning: ``json.dumps`` already escapes C0 controls.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO

__all__ = ["Printable", "printable_output", "shown"]


def shown(text: str) -> str:
    """``text`` with every non-printable character but newline and tab escaped."""
    if text.isprintable():
        return text
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


class Printable:
    """A text stream that escapes what :func:`shown` escapes, then writes to ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(shown(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """Route ``sys.stdout`` and ``sys.stderr`` through :class:`Printable` for a block."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Printable(out), Printable(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
