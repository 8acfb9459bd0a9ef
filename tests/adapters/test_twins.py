"""The sync and async twins cannot drift apart: their public surfaces are compared here.

psycopg's sync/async functions and cursors, the leases' sync/async classes, and the three
drivers' adapters (one surface: install, uninstall, transaction, set_token) are checked by
name, parameter names, kinds and defaults. Adding a parameter to one twin only fails here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import fencekit.psycopg as fkpg
from fencekit.leases import AsyncLease, AsyncPostgresIssuer, Lease, PostgresIssuer


def _shape(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """Parameters as (name, kind, default): annotations differ between twins by design."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: member
        for name, member in vars(cls).items()
        if callable(member) and (not name.startswith("_") or name in {"__enter__", "__aenter__"})
    }


@pytest.mark.parametrize(
    ("sync", "async_"),
    [
        (fkpg.transaction, fkpg.async_transaction),
        (fkpg.set_token, fkpg.async_set_token),
        (fkpg.FencedCursor.execute, fkpg.AsyncFencedCursor.execute),
        (fkpg.FencedCursor.executemany, fkpg.AsyncFencedCursor.executemany),
    ],
)
def test_psycopg_twins_take_the_same_parameters(sync: Any, async_: Any) -> None:
    assert _shape(sync) == _shape(async_)
    assert inspect.iscoroutinefunction(async_) or not inspect.iscoroutinefunction(sync)


def test_psycopg_every_sync_function_has_its_async_twin() -> None:
    public = set(fkpg.__all__)
    sync = {n for n in public if not n.startswith(("async_", "Async"))}
    twinned = {n for n in sync if f"async_{n}" in public or f"Async{n}" in public}
    # These take either kind of connection (or none): one function, no twin.
    assert sync - twinned == {"install", "uninstall", "is_installed", "AnyConnection"}
    assert set(_public_methods(fkpg.FencedCursor)) == set(_public_methods(fkpg.AsyncFencedCursor))


@pytest.mark.parametrize(
    ("sync", "async_"), [(Lease, AsyncLease), (PostgresIssuer, AsyncPostgresIssuer)]
)
def test_lease_twins_have_the_same_surface(sync: type, async_: type) -> None:
    ours, theirs = _public_methods(sync), _public_methods(async_)
    assert set(ours) - {"__enter__"} == set(theirs) - {"__aenter__"}
    for name in set(ours) & set(theirs):
        assert _shape(ours[name]) == _shape(theirs[name]), name


def test_every_driver_adapter_has_one_surface() -> None:
    import fencekit.asyncpg as fkapg
    import fencekit.psycopg2 as fkpg2

    for adapter in (fkpg, fkpg2, fkapg):
        for name in ("install", "uninstall", "is_installed", "transaction", "set_token"):
            assert callable(getattr(adapter, name)), (adapter.__name__, name)
        # one install() signature: the target, and whether this adapter counts rejections
        assert _shape(adapter.install)[1:] == [
            ("translate_errors", inspect.Parameter.KEYWORD_ONLY, True)
        ], adapter.__name__
        assert adapter.is_installed(object()) is False, adapter.__name__
        # transaction(conn, token=None, *, issuer=None, ...) everywhere
        assert _shape(adapter.transaction)[:3] == [
            ("conn", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
            ("token", inspect.Parameter.POSITIONAL_OR_KEYWORD, None),
            ("issuer", inspect.Parameter.KEYWORD_ONLY, None),
        ], adapter.__name__
        assert _shape(adapter.set_token) == _shape(fkpg.set_token), adapter.__name__


def test_sql_spliced_tokens_and_issuers_are_checked_again() -> None:
    """The wire splices the token and issuer into SQL text: its builders refuse anything
    fencing() would not have let through, whoever calls them."""
    from fencekit import wire

    for build in (wire.set_local, wire.set_config):
        assert "'34'" in build(("34", "etcd"))
        for bad in (("34'; DROP TABLE t; --", ""), ("34", "x'; DROP TABLE t; --"), ("-1", "")):
            with pytest.raises(ValueError, match="not a validated"):
                build(bad)


def test_every_install_refuses_what_it_cannot_fence_and_says_what_it_got() -> None:
    """A stand-in connection (a harness's fake, another driver's) gets a sentence, not a
    TypeError from deep inside: what install() takes, and what it was given."""
    import fencekit.asyncpg as fkapg
    import fencekit.psycopg2 as fkpg2
    import fencekit.sqlalchemy as fksa

    class StandIn:
        pass

    for adapter in (fkpg, fkpg2, fkapg, fksa):
        with pytest.raises(TypeError, match=r"install\(\) takes .* not .*StandIn"):
            adapter.install(StandIn())  # type: ignore[arg-type]
        assert adapter.is_installed(StandIn()) is False
        assert _shape(adapter.install)[1:] == [
            ("translate_errors", inspect.Parameter.KEYWORD_ONLY, True)
        ], adapter.__name__
