"""submitter 3: the compute a cached step's reuse saved (``cache_saved_seconds``)."""

import sqlalchemy as sa
from alembic import op

revision = "submitter_0003"
down_revision = "submitter_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("submitter_steps", sa.Column("cache_saved_seconds", sa.Float(),
                                               nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("submitter_steps", "cache_saved_seconds")
