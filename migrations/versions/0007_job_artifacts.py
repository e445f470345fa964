"""job_artifacts: the blobs each job refers to and their sizes, for the per-tenant
stored-bytes quota and for retention (issue 26); filled in for the jobs already stored,
their sizes left unknown for the retention sweep to ask the store

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 10:00:00.000000
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_JOBS = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("model_digest", sa.String),
    sa.column("data_files", sa.JSON),
    sa.column("fused_digest", sa.String),
    sa.column("report_digest", sa.String),
    sa.column("summary", sa.JSON),
)


def _digests(row: Any) -> set[str]:
    """Every blob the job row names, wherever it names it (as the worker writes them)."""
    summary = row.summary if isinstance(row.summary, dict) else {}
    named = [row.model_digest, row.fused_digest, row.report_digest]
    for files in (row.data_files, summary.get("fused_data_files")):
        named += [f.get("digest") for f in files or [] if isinstance(f, dict)]
    artifacts = summary.get("artifacts")
    named += list(artifacts.values()) if isinstance(artifacts, dict) else []
    return {d for d in named if isinstance(d, str) and len(d) == 64}


def upgrade() -> None:
    table = op.create_table(
        "job_artifacts",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "digest"),
    )
    op.create_index("ix_job_artifacts_digest", "job_artifacts", ["digest"])
    # The jobs stored so far keep their blobs: without a row, retention would take them
    # for blobs nobody refers to.
    rows = op.get_bind().execute(sa.select(_JOBS)).all()
    references = [
        {"job_id": row.id, "digest": digest, "size": None}
        for row in rows
        for digest in _digests(row)
    ]
    if references:
        op.bulk_insert(table, references)


def downgrade() -> None:
    op.drop_index("ix_job_artifacts_digest", table_name="job_artifacts")
    op.drop_table("job_artifacts")
