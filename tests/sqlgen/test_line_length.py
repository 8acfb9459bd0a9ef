"""Generated SQL is read by DBAs: no line of any script fencekit prints is longer than 120
characters, for every scope and option of the golden specs."""

from __future__ import annotations

import pytest

from fencekit import sqlgen
from fencekit.spec import TableName
from tests.sqlgen.golden_specs import SPECS

LIMIT = 120


def _scripts() -> dict[str, str]:
    out = {
        "install": sqlgen.render_install(),
        "install --no-transaction": sqlgen.render_install(transaction=False),
        "uninstall": sqlgen.render_uninstall(list(SPECS.values())[:1]),
    }
    for name, spec in SPECS.items():
        out[f"protect {name}"] = sqlgen.render_protect(spec)
        out[f"unprotect {name}"] = sqlgen.render_unprotect(spec)
        out[f"rename {name}"] = sqlgen.render_rename(spec, TableName("app", "invoices_2024"))
        for other_name, other in SPECS.items():
            if other != spec:
                out[f"move {name} -> {other_name}"] = sqlgen.render_move(spec, other)
    return out


SCRIPTS = _scripts()


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_generated_line_is_longer_than_120_characters(name: str) -> None:
    long = [
        f"line {i} ({len(line)} characters): {line[:80]}..."
        for i, line in enumerate(SCRIPTS[name].splitlines(), 1)
        if len(line) > LIMIT
    ]
    assert not long, "\n".join(long)


def test_the_unprotect_guard_is_one_core_call() -> None:
    """As protect's guard is (fencekit.protect_guard): the check lives in the core, the script
    names it."""
    for spec in SPECS.values():
        guard = sqlgen.unprotect_statements(spec)[0]
        assert guard.startswith("SELECT fencekit.unprotect_guard(")
        assert len(guard.splitlines()) <= 5
