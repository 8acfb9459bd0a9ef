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
from fencekit.spec import FenceSpec, TableName
from fencekit.sqlgen import protect_statements

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
