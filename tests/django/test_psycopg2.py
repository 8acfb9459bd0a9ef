"""Django's psycopg2 backend: the same wiring, with no driver adapter (psycopg2_scenario.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db(transaction=True)
def test_the_psycopg2_backend_carries_the_token_and_reports_rejections() -> None:
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "FK_DJANGO_DB": json.dumps(
            {k: db[k] for k in ("NAME", "HOST", "PORT", "USER", "PASSWORD")}
        ),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    run = subprocess.run(
        [sys.executable, "-m", "tests.django.psycopg2_scenario"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["driver"] == "psycopg2"
    assert out["installed"] is True
    assert out["total"] == 3  # the autocommit write, then the update after the savepoint
    # Django code catches fencekit's class (also a django.db.DatabaseError: the scenario caught
    # it as one); the cause is psycopg2's error carrying fencekit's SQLSTATE.
    stale = {
        "django": "StaleTokenError",
        "cause_module": "psycopg2",
        "sqlstate": "YF001",
        "translated": "StaleTokenError",
    }
    assert out["stale"] == stale
    assert out["missing"]["sqlstate"] == "YF003"
    assert out["missing"]["django"] == "MissingTokenError"
