"""Where the alembic project template lives, installed or in a source tree."""

from __future__ import annotations

from pathlib import Path

__all__ = ["TEMPLATE_NAME", "templates_root"]

TEMPLATE_NAME = "fencekit"


def templates_root() -> Path:
    """The directory holding the ``fencekit`` alembic template.

    A wheel ships ``migrations_templates/`` inside the package (``alembic_plugin/templates``); a
    source checkout or editable install has it at the repository's top level.
    """
    here = Path(__file__).resolve().parent
    for root in (here / "templates", here.parent.parent / "migrations_templates"):
        if (root / TEMPLATE_NAME / "env.py").is_file():
            return root
    raise FileNotFoundError(
        "fencekit's alembic template is missing from this installation "
        f"(looked in {here / 'templates'}); reinstall pg-fencekit"
    )
