"""monitor 2: why a step failed (``failure_reason``) and every failed attempt of a step
(``monitor_step_failures``), for the learned retry limits."""

import sqlalchemy as sa
from alembic import op

revision = "monitor_0002"
down_revision = "monitor_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("monitor_steps", sa.Column("failure_reason", sa.Text(), nullable=False,
                                             server_default=""))
    op.create_table(
        "monitor_step_failures",
        sa.Column("run_id", sa.String(255), primary_key=True),
        sa.Column("step", sa.String(255), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("workflow", sa.String(255), nullable=False),
        sa.Column("failure_class", sa.String(16), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_monitor_step_failures_workflow_step", "monitor_step_failures",
                    ["workflow", "step"])


def downgrade() -> None:
    op.drop_index("ix_monitor_step_failures_workflow_step", "monitor_step_failures")
    op.drop_table("monitor_step_failures")
    op.drop_column("monitor_steps", "failure_reason")
