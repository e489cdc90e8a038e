"""monitor 1: runs, step records, utilization samples and recommendations (with outbox flag)."""

import sqlalchemy as sa
from alembic import op

revision = "monitor_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "monitor_runs",
        sa.Column("run_id", sa.String(255), primary_key=True),
        sa.Column("workflow", sa.String(255), nullable=False),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("reopened_at", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_monitor_runs_seen_at", "monitor_runs", ["seen_at"])
    op.create_index("ix_monitor_runs_workflow", "monitor_runs", ["workflow"])
    op.create_table(
        "monitor_steps",
        sa.Column("run_id", sa.String(255), primary_key=True),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("workflow", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("peak_cpu", sa.Float(), nullable=True),
        sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("cached", sa.Boolean(), nullable=False),
        sa.Column("cache_key", sa.String(255), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("failure_class", sa.String(16), nullable=True),
        sa.Column("max_peak_cpu", sa.Float(), nullable=True),
        sa.Column("max_peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("oom_seen", sa.Boolean(), nullable=False),
        sa.Column("oom_peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("event_at", sa.Float(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
    )
    op.create_index("ix_monitor_steps_workflow_name", "monitor_steps", ["workflow", "name"])
    op.create_table(
        "monitor_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("workflow", sa.String(255), nullable=False),
        sa.Column("step", sa.String(255), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at_ns", sa.BigInteger(), nullable=False),
        sa.Column("cpu", sa.Float(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("run_id", "step", "key", "attempt", "at_ns",
                            name="uq_monitor_samples_measurement"),
    )
    op.create_index("ix_monitor_samples_workflow_step", "monitor_samples", ["workflow", "step"])
    op.create_index("ix_monitor_samples_run_id", "monitor_samples", ["run_id"])
    op.create_table(
        "monitor_recommendations",
        sa.Column("workflow", sa.String(255), primary_key=True),
        sa.Column("step", sa.String(255), primary_key=True),
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("value", sa.String(64), nullable=False),
        sa.Column("id", sa.String(700), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("based_on", sa.Integer(), nullable=False),
        sa.Column("failure_class", sa.String(16), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("published", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_monitor_recommendations_published", "monitor_recommendations",
                    ["published"])


def downgrade() -> None:
    op.drop_table("monitor_recommendations")
    op.drop_table("monitor_samples")
    op.drop_table("monitor_steps")
    op.drop_table("monitor_runs")
