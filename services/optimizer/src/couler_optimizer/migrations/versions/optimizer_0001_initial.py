"""optimizer 1: the monitor's recommendations (latest per workflow, step, kind) and plans."""

import sqlalchemy as sa
from alembic import op

revision = "optimizer_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "optimizer_recommendations",
        sa.Column("workflow", sa.String(255), primary_key=True),
        sa.Column("step", sa.String(255), primary_key=True),  # "" = workflow-level
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("value", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("based_on_samples", sa.Integer(), nullable=False),
        sa.Column("failure_class", sa.String(32), nullable=True),
        sa.Column("rec_id", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=True),  # when the monitor made it
        sa.Column("received_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "optimizer_plans",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(255), nullable=False),  # "" for an anonymous Optimize
        # The run id for plans made from events (one per run); NULL for Optimize calls.
        sa.Column("event_run_id", sa.String(255), nullable=True, unique=True),
        sa.Column("workflow", sa.String(255), nullable=False),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("workflow_digest", sa.String(80), nullable=False),
        sa.Column("passes", sa.Text(), nullable=False),  # JSON: [{name, changed, notes}]
        sa.Column("cached_steps", sa.Text(), nullable=False),  # JSON: [step, ...]
        sa.Column("chunk_count", sa.Integer(), nullable=False),
        sa.Column("plan", sa.LargeBinary(), nullable=True),  # couler.v1.Plan, event plans only
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_optimizer_plans_workflow", "optimizer_plans", ["workflow"])
    op.create_index("ix_optimizer_plans_run_id", "optimizer_plans", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_optimizer_plans_run_id", "optimizer_plans")
    op.drop_index("ix_optimizer_plans_workflow", "optimizer_plans")
    op.drop_table("optimizer_plans")
    op.drop_table("optimizer_recommendations")
