"""cache 3: an evicted entry's metadata is kept with its lineage node.

``cache_lineage.record`` holds, as JSON, what the entry was when its bytes were evicted (or
its commit refused): workflow, step, outputs, artifact digests and sizes, size, cost,
lineage, hits and times -- so ``Show`` still answers for it. Nodes evicted before this
revision have none (NULL).
"""

import sqlalchemy as sa
from alembic import op

revision = "cache_0003"
down_revision = "cache_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cache_lineage") as batch:
        batch.add_column(sa.Column("record", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cache_lineage") as batch:
        batch.drop_column("record")
