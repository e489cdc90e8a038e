"""alpha 2: steps belong to runs; runs get a creation time."""

import sqlalchemy as sa
from alembic import op

revision = "alpha_0002"
down_revision = "alpha_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("alpha_runs") as batch:
        batch.add_column(sa.Column("created", sa.Float(), nullable=False, server_default="0"))
    op.create_table(
        "alpha_steps",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("alpha_runs.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
    )


def downgrade() -> None:
    op.drop_table("alpha_steps")
    with op.batch_alter_table("alpha_runs") as batch:
        batch.drop_column("created")
