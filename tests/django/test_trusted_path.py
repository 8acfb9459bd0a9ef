"""``migrate`` refuses when the migrating role's search_path reaches a schema a table owner
controls (a schema named after the migrating role), before Django reads django_migrations."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from fencekit.errors import CatalogError


@pytest.mark.django_db
def test_migrate_refuses_a_schema_named_after_the_migrating_role() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT current_user")
        (me,) = cur.fetchone()
        cur.execute("CREATE ROLE fk_trusted_path_owner")  # rolled back with the test
        cur.execute(f'CREATE SCHEMA "{me}" AUTHORIZATION fk_trusted_path_owner')
    with pytest.raises(CatalogError, match=f'schema "{me}", owned by role "fk_trusted_path_owner"'):
        call_command("migrate", verbosity=0)


@pytest.mark.django_db
def test_migrate_runs_on_a_trusted_path() -> None:
    call_command("migrate", verbosity=0)
