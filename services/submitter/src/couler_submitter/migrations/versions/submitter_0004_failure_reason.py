"""submitter 4: why a failed step's failure is of its class (``failure_reason``)."""

import sqlalchemy as sa
from alembic import op

revision = "submitter_0004"
down_revision = "submitter_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("submitter_steps", sa.Column("failure_reason", sa.Text(), nullable=False,
                                               server_default=""))


def downgrade() -> None:
    op.drop_column("submitter_steps", "failure_reason")
