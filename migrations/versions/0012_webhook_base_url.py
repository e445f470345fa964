"""webhooks: the address a job was submitted to, for its message's absolute links

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-10 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_webhooks") as batch:
        batch.add_column(sa.Column("base_url", sa.String(length=2000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_webhooks") as batch:
        batch.drop_column("base_url")
