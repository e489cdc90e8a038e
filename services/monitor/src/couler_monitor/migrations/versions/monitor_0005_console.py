"""monitor 5: what the console shows beyond states -- each run's planned graph
(``monitor_run_plans``: the optimized workflow as its protobuf) and, per step record, its
outputs, stored artifacts and the compute a cache reuse saved."""

import sqlalchemy as sa
from alembic import op

revision = "monitor_0005"
down_revision = "monitor_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("monitor_steps") as batch:
        batch.add_column(sa.Column("outputs", sa.Text(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("artifacts", sa.Text(), nullable=False,
                                   server_default="{}"))
        batch.add_column(sa.Column("cache_saved_seconds", sa.Float(), nullable=True))
    op.create_table(
        "monitor_run_plans",
        sa.Column("run_id", sa.String(255), primary_key=True),
        sa.Column("workflow", sa.LargeBinary(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("monitor_run_plans")
    with op.batch_alter_table("monitor_steps") as batch:
        batch.drop_column("cache_saved_seconds")
        batch.drop_column("artifacts")
        batch.drop_column("outputs")
