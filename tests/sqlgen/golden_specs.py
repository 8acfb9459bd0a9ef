"""The specs whose generated SQL is kept as golden files: one per scope and option.

Regenerate after a reviewed change to the generator with:

    .venv/bin/python -m tests.sqlgen.regen

then read the diff of tests/sqlgen/golden/ as part of the review (and bump
sqlgen.TEMPLATE_VERSION when existing tables need their objects replaced).
"""

from __future__ import annotations

from pathlib import Path

from fencekit import sqlgen
from fencekit.spec import FenceSpec, Scope, TableName

GOLDEN = Path(__file__).parent / "golden"

_T = TableName("app", "invoices")

SPECS: dict[str, FenceSpec] = {
    "row": FenceSpec(_T),
    "row-on-missing-allow": FenceSpec(_T, on_missing="allow"),
    "row-on-equal-reject": FenceSpec(_T, on_equal="reject"),
    "row-custom-column": FenceSpec(_T, column="Fence Column"),
    "key": FenceSpec(_T, scope=Scope.KEY, key=("account_id",)),
    "key-composite-resource-issuer": FenceSpec(
        _T, scope=Scope.KEY, key=("tenant_id", "account_id"), resource="billing", issuer="etcd"
    ),
    "key-lease-bound": FenceSpec(_T, scope=Scope.KEY, key=("account_id",), lease_bound=True),
    "key-on-missing-allow": FenceSpec(_T, scope=Scope.KEY, key=("account_id",), on_missing="allow"),
    "table": FenceSpec(_T, scope=Scope.TABLE),
    "table-lease-bound-on-equal-reject": FenceSpec(
        _T, scope=Scope.TABLE, lease_bound=True, on_equal="reject"
    ),
}


def render(name: str) -> str:
    spec = SPECS[name]
    return sqlgen.render_protect(spec) + "\n" + sqlgen.render_unprotect(spec)


def path(name: str) -> Path:
    return GOLDEN / f"{name}.sql"
