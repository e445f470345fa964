"""jobs: error_type (the failed job's problem type) and attempt_log (each attempt's
outcome, which makes a crash that repeats itself poison after the second attempt)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 17:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("error_type", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("attempt_log", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("attempt_log")
        batch_op.drop_column("error_type")
