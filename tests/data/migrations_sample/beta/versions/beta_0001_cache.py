"""beta 1: the cache index."""

import sqlalchemy as sa
from alembic import op

revision = "beta_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "beta_cache",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("beta_cache")
