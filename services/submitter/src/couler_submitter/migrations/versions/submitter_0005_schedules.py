"""submitter 5: cron schedules and what became of each of their ticks."""

import sqlalchemy as sa
from alembic import op

revision = "submitter_0005"
down_revision = "submitter_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One per template with a cron schedule: the workflow itself is the template's.
    op.create_table(
        "submitter_schedules",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        # The last tick handled (launched or skipped), seconds since the epoch.
        sa.Column("last_tick", sa.Float(), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
    )
    # One row per (schedule, tick) handled: the primary key is the claim that keeps two
    # submitters from launching a tick twice (inserted with the tick's run, or its skip).
    op.create_table(
        "submitter_schedule_ticks",
        sa.Column("schedule", sa.String(63), primary_key=True),
        sa.Column("tick", sa.Float(), primary_key=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("reason", sa.Text(), nullable=False, server_default=""),
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_submitter_runs_template", "submitter_runs", ["template", "state"])


def downgrade() -> None:
    op.drop_index("ix_submitter_runs_template", "submitter_runs")
    op.drop_table("submitter_schedule_ticks")
    op.drop_table("submitter_schedules")
