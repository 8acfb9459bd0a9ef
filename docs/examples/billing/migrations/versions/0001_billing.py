"""billing: invoices and the key-fenced billing summary

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

import fencekit.alembic_plugin  # noqa: F401  (registers op.install_fencekit, op.create_fence)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.install_fencekit(core_version=1)
    op.create_table(
        "invoices",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "billing_summary",
        sa.Column("account_id", sa.Integer(), primary_key=True),
        sa.Column("total_cents", sa.BigInteger(), nullable=False),
        sa.Column("invoice_count", sa.Integer(), nullable=False),
        sa.Column("rebuilt_by", sa.Text(), nullable=False),
        sa.Column(
            "rebuilt_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    # Written by hand, so the current template is rendered when it runs; autogenerate freezes
    # the statements into the file instead (sql=(...)), see docs/alembic.md.
    op.create_fence("billing_summary", scope="key", key=["account_id"])


def downgrade() -> None:
    op.drop_fence("billing_summary", scope="key", key=["account_id"])
    op.drop_table("billing_summary")
    op.drop_table("invoices")
