"""data uploads: big external-data files sent in parts, resumable (issue 29)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-08 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "data_uploads",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("received", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("parts", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_data_uploads_tenant_id", "data_uploads", ["tenant_id"])
    op.create_index("ix_data_uploads_digest", "data_uploads", ["digest"])
    op.create_index("ix_data_uploads_expires_at", "data_uploads", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_data_uploads_expires_at", table_name="data_uploads")
    op.drop_index("ix_data_uploads_digest", table_name="data_uploads")
    op.drop_index("ix_data_uploads_tenant_id", table_name="data_uploads")
    op.drop_table("data_uploads")
