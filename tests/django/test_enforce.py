"""``EnforceFence``: a model's table from rollout mode to enforcing in one migration step,
refused while the rollout report shows a writer without a token."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from fencekit.catalog import CatalogError
from fencekit.django.enforce import EnforceFence
from fencekit.django.fences import META_OPTION
from fencekit.spec import FenceSpec, Scope, TableName
from fencekit.sqlgen import protect_statements, unprotect_statements

JOB = TableName("public", "shop_job")


def _on_missing() -> str:
    with connection.cursor() as c:
        c.execute("SELECT spec FROM fencekit.protected WHERE table_name = 'shop_job'")
        (spec,) = c.fetchone()
    return str((json.loads(spec) if isinstance(spec, str) else spec)["on_missing"])


def _protect(on_missing: str) -> None:
    with connection.cursor() as c:
        for s in protect_statements(FenceSpec(JOB, on_missing=on_missing)):  # type: ignore[arg-type]
            c.execute(s)


@pytest.mark.django_db(transaction=True)
def test_enforce_fence_refuses_while_a_writer_is_seen_and_reverses() -> None:
    _protect("allow")
    try:
        with connection.cursor() as c:
            c.execute("DELETE FROM shop_job WHERE id = -1")  # a writer without a token
        state = MigrationLoader(connection).project_state()
        op = EnforceFence("Job", window="1h")
        with (
            pytest.raises(CatalogError, match="written without a token"),
            connection.schema_editor() as editor,
        ):
            op.database_forwards("shop", editor, state, state)
        assert _on_missing() == "allow"
        after = state.clone()
        forced = EnforceFence("Job", window="1h", force=True)
        forced.state_forwards("shop", after)
        assert after.models["shop", "job"].options[META_OPTION].on_missing == "reject"
        with connection.schema_editor() as editor:
            forced.database_forwards("shop", editor, state, after)
        assert _on_missing() == "reject"
        with connection.schema_editor() as editor:
            forced.database_backwards("shop", editor, after, state)
        assert _on_missing() == "allow"
        assert forced.deconstruct() == (
            "EnforceFence",
            [],
            {"model_name": "Job", "window": "1h", "force": True},
        )
    finally:
        _protect("reject")


PLAIN = FenceSpec(TableName("public", "shop_plainsummary"), scope=Scope.TABLE, on_missing="allow")


def _refused_with(match: str) -> None:
    state = MigrationLoader(connection).project_state()
    with pytest.raises(CatalogError, match=match), connection.schema_editor() as editor:
        EnforceFence("PlainSummary", window="1h").database_forwards("shop", editor, state, state)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("before", "after", "match"),
    [
        (
            "CREATE TABLE plain_kid () INHERITS (shop_plainsummary); CREATE TABLE plain_side ()",
            "ALTER TABLE plain_kid INHERIT plain_side",
            r"child table public\.plain_kid also inherits from public\.plain_side",
        ),
        (
            "SELECT",
            "CREATE TABLE plain_kid () INHERITS (shop_plainsummary)",
            r"inheritance child public\.plain_kid lacks fencekit's trigger",
        ),
    ],
    ids=["child-with-outside-parent", "child-made-after-protect"],
)
def test_enforce_fence_refuses_while_writes_reach_the_table_unseen(
    before: str, after: str, match: str
) -> None:
    """A child that also inherits from a table outside the tree, or one made after protect:
    a tokenless write through it is neither counted nor attributed, so the operation
    refuses, with the report's words. ``before`` and ``after``: the DDL around protect."""
    try:
        with connection.cursor() as c:
            c.execute(before)
            for s in protect_statements(PLAIN):
                c.execute(s)
            c.execute(
                "UPDATE fencekit.protected SET protected_at = now() - interval '2 hours'"
                " WHERE table_name = 'shop_plainsummary'"
            )
            c.execute(after)
        _refused_with(match)
    finally:
        with connection.cursor() as c:
            c.execute("DROP TABLE IF EXISTS plain_kid, plain_side")
            for s in unprotect_statements(PLAIN):
                c.execute(s)
