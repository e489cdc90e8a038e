"""monitor 3: the recommender's histograms and runs, the steps' planned requests, and the
evidence of resource recommendations."""

import sqlalchemy as sa
from alembic import op

revision = "monitor_0003"
down_revision = "monitor_0002"
branch_labels = None
depends_on = None

_EVIDENCE = (
    ("target", sa.String(64)), ("lower_bound", sa.String(64)), ("upper_bound", sa.String(64)),
    ("percentile", sa.Float()), ("runs", sa.Integer()), ("samples", sa.BigInteger()),
    ("span_seconds", sa.Float()),
)


def upgrade() -> None:
    for name, kind in _EVIDENCE:
        op.add_column("monitor_recommendations", sa.Column(name, kind, nullable=True))
    op.create_table(
        "monitor_recommender_state",
        sa.Column("workflow", sa.String(255), primary_key=True),
        sa.Column("step", sa.String(255), primary_key=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "monitor_recommender_runs",
        sa.Column("workflow", sa.String(255), primary_key=True),
        sa.Column("step", sa.String(255), primary_key=True),
        sa.Column("run_id", sa.String(255), primary_key=True),
        sa.Column("memory_bytes", sa.Float(), nullable=True),
        sa.Column("at", sa.Float(), nullable=True),
        sa.Column("ended", sa.Boolean(), nullable=False),
        sa.Column("counted", sa.Boolean(), nullable=False),
    )
    op.create_table(
        "monitor_step_requests",
        sa.Column("workflow", sa.String(255), primary_key=True),
        sa.Column("step", sa.String(255), primary_key=True),
        sa.Column("cpu_request", sa.String(64), nullable=False),
        sa.Column("memory_request", sa.String(64), nullable=False),
        sa.Column("cpu_limit", sa.String(64), nullable=False),
        sa.Column("memory_limit", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("monitor_step_requests")
    op.drop_table("monitor_recommender_runs")
    op.drop_table("monitor_recommender_state")
    with op.batch_alter_table("monitor_recommendations") as batch:
        for name, _ in reversed(_EVIDENCE):
            batch.drop_column(name)
