"""idempotency_reservations: the Idempotency-Keys whose first request is still being
received, so that a second request with the key meanwhile is answered 409

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 21:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_reservations",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("token", sa.String(length=36), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("tenant_id", "key"),
    )


def downgrade() -> None:
    op.drop_table("idempotency_reservations")
