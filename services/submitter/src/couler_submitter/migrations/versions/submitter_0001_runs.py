"""submitter 1: runs, their steps, registered templates, and terminated messages."""

import sqlalchemy as sa
from alembic import op

revision = "submitter_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "submitter_runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        # NULL for runs submitted without a key; UNIQUE makes a repeated Submit lose the
        # insert race instead of starting a second run.
        sa.Column("idempotency_key", sa.String(255), nullable=True, unique=True),
        sa.Column("workflow", sa.String(255), nullable=False, server_default=""),
        sa.Column("workflow_digest", sa.String(80), nullable=False, server_default=""),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("request", sa.LargeBinary(), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("template", sa.String(63), nullable=False, server_default=""),
        sa.Column("options", sa.Text(), nullable=False, server_default="{}"),
        sa.Column("plan", sa.LargeBinary(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("engine_run_id", sa.String(255), nullable=False, server_default=""),
        sa.Column("passes", sa.Text(), nullable=False, server_default="[]"),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("created_at", sa.Float(), nullable=False, index=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("revision", sa.BigInteger(), nullable=False, server_default="1"),
        sa.Column("retries", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("dry_run", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_submitter_runs_workflow", "submitter_runs", ["workflow"])
    op.create_table(
        "submitter_steps",
        sa.Column("run_id", sa.String(64),
                  sa.ForeignKey("submitter_runs.run_id", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(512), primary_key=True),
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("peak_cpu", sa.Float(), nullable=True),
        sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("outputs", sa.Text(), nullable=False, server_default="{}"),
        sa.Column("cache_key", sa.String(255), nullable=False, server_default=""),
        sa.Column("cached", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("failure_class", sa.String(16), nullable=False, server_default=""),
        sa.Column("artifacts", sa.Text(), nullable=False, server_default="{}"),
    )
    op.create_table(
        "submitter_templates",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("workflow", sa.LargeBinary(), nullable=False),
        sa.Column("engine", sa.String(32), nullable=False, server_default=""),
        sa.Column("workflow_digest", sa.String(80), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "submitter_rejections",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("durable", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("stream_sequence", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("submitter_rejections")
    op.drop_table("submitter_templates")
    op.drop_table("submitter_steps")
    op.drop_index("ix_submitter_runs_workflow", "submitter_runs")
    op.drop_table("submitter_runs")
