"""jobs: an index on (tenant_id, created_at, id), the order of the job list's keyset
pages (GET /v1/jobs with page tokens)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 21:45:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_tenant_created_id", "jobs", ["tenant_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_created_id", table_name="jobs")
