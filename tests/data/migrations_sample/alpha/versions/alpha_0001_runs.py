"""alpha 1: the runs table."""

import sqlalchemy as sa
from alembic import op

revision = "alpha_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alpha_runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("alpha_runs")
