"""optimizer 2: the document-size budget learned per engine from its size refusals."""

import sqlalchemy as sa
from alembic import op

revision = "optimizer_0002"
down_revision = "optimizer_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "optimizer_learned_budgets",
        sa.Column("engine", sa.String(32), primary_key=True),
        sa.Column("max_bytes", sa.BigInteger(), nullable=False),  # what chunks stay within
        # The smallest document the engine refused, and that refusal's details.
        sa.Column("refused_bytes", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("workflow", sa.String(255), nullable=False),
        sa.Column("refused_at", sa.Float(), nullable=False),
        sa.Column("refusals", sa.Integer(), nullable=False),  # how many were received
    )


def downgrade() -> None:
    op.drop_table("optimizer_learned_budgets")
