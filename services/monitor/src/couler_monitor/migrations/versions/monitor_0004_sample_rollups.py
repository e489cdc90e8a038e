"""monitor 4: utilization time series -- the interval of a sample, and 1-minute rollups.

``monitor_samples`` gets ``interval_seconds`` (NULL for the samples stored before: single
readings) and an index on ``at_ns`` (the compaction takes the oldest first).
``monitor_sample_rollups`` keeps, per step execution and minute, what the raw samples of
that minute said once they are compacted: their count, the sum and the highest of their
CPU (the mean is sum / count) and the highest memory.
"""

import sqlalchemy as sa
from alembic import op

revision = "monitor_0004"
down_revision = "monitor_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("monitor_samples") as batch:
        batch.add_column(sa.Column("interval_seconds", sa.Float(), nullable=True))
    op.create_index("ix_monitor_samples_at_ns", "monitor_samples", ["at_ns"])
    op.create_table(
        "monitor_sample_rollups",
        sa.Column("run_id", sa.String(255), primary_key=True),
        sa.Column("step", sa.String(255), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("minute", sa.BigInteger(), primary_key=True),
        sa.Column("workflow", sa.String(255), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("cpu_sum", sa.Float(), nullable=False),
        sa.Column("cpu_max", sa.Float(), nullable=False),
        sa.Column("memory_max", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_monitor_sample_rollups_workflow_step", "monitor_sample_rollups",
                    ["workflow", "step"])
    op.create_index("ix_monitor_sample_rollups_minute", "monitor_sample_rollups", ["minute"])


def downgrade() -> None:
    op.drop_table("monitor_sample_rollups")
    op.drop_index("ix_monitor_samples_at_ns", "monitor_samples")
    with op.batch_alter_table("monitor_samples") as batch:
        batch.drop_column("interval_seconds")
