"""Canary matrix: every CLI command run as a fencekit_admin member (see _cli.py)."""

from __future__ import annotations

import pytest

from tests.security.canary._cli import run_cli_commands
from tests.security.canary.conftest import Planted

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


def test_cli_commands(planted: Planted) -> None:
    run_cli_commands(planted, "admin")
