"""verdicts: measured selection's decisions per region signature and machine class, and
patterns disabled per machine class (issue 28)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("signature", sa.String(length=64), nullable=False),
        sa.Column("pattern", sa.String(length=200), nullable=False),
        sa.Column("pattern_hash", sa.String(length=64), nullable=False),
        sa.Column("group_key", sa.String(length=500), nullable=False),
        sa.Column("region", sa.JSON(), nullable=False),
        sa.Column("machine_key", sa.String(length=64), nullable=False),
        sa.Column("machine", sa.JSON(), nullable=False),
        sa.Column("onnxruntime", sa.String(length=40), nullable=False),
        sa.Column("cpu", sa.String(length=200), nullable=False),
        sa.Column("target", sa.String(length=40), nullable=False),
        sa.Column("median", sa.Float(), nullable=False),
        sa.Column("low", sa.Float(), nullable=False),
        sa.Column("high", sa.Float(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("with_ms", sa.Float(), nullable=True),
        sa.Column("predicted", sa.JSON(), nullable=True),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=True),
        sa.Column("tenant_id", sa.String(length=64), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_verdicts_lookup", "verdicts", ["machine_key", "signature"])
    op.create_index("ix_verdicts_host", "verdicts", ["onnxruntime", "cpu"])
    op.create_index("ix_verdicts_pattern", "verdicts", ["pattern"])
    op.create_index("ix_verdicts_verdict", "verdicts", ["verdict"])
    op.create_index("ix_verdicts_measured_at", "verdicts", ["measured_at"])
    op.create_index("ix_verdicts_job_id", "verdicts", ["job_id"])
    op.create_table(
        "pattern_class_rules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("pattern", sa.String(length=200), nullable=False),
        sa.Column("machine_key", sa.String(length=64), nullable=False),
        sa.Column("machine", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("pattern", "machine_key", name="uq_pattern_class_rules"),
    )
    op.create_index("ix_pattern_class_rules_pattern", "pattern_class_rules", ["pattern"])
    op.create_index("ix_pattern_class_rules_machine_key", "pattern_class_rules", ["machine_key"])


def downgrade() -> None:
    op.drop_table("pattern_class_rules")
    op.drop_table("verdicts")
