"""cache 2: value-based eviction -- entry cost, lineage, pin and priority; lineage nodes.

Existing entries get cost 0 (not measured), no lineage, unpinned, and a lineage node each;
``created_seq`` takes their ``used_seq`` (the commit order is not recorded) and their
priorities are computed at the next start (``cache_meta`` is empty, so the service prices
every entry under the policy it is configured with).
"""

import sqlalchemy as sa
from alembic import op

revision = "cache_0002"
down_revision = "cache_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cache_entries") as batch:
        batch.add_column(sa.Column("cost_seconds", sa.Float(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("lineage", sa.Text(), nullable=False,
                                   server_default="[]"))
        batch.add_column(sa.Column("pinned", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
        batch.add_column(sa.Column("created_seq", sa.BigInteger(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("freq_log", sa.Float(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("lost_cost_seconds", sa.Float(), nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("priority", sa.Float(), nullable=False,
                                   server_default="0"))
    entries = sa.table("cache_entries", sa.column("key", sa.String()),
                       sa.column("used_seq", sa.BigInteger()),
                       sa.column("created_seq", sa.BigInteger()),
                       sa.column("priority", sa.Float()))
    op.execute(entries.update().values(created_seq=entries.c.used_seq,
                                       priority=entries.c.used_seq))
    op.create_index("ix_cache_entries_victim", "cache_entries",
                    ["pinned", "priority", "used_seq", "key"])
    lineage = op.create_table(
        "cache_lineage",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("cost_seconds", sa.Float(), nullable=False),
        sa.Column("parents", sa.Text(), nullable=False),
        sa.Column("evicted_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_cache_lineage_evicted_at", "cache_lineage", ["evicted_at"])
    op.create_table(
        "cache_edges",
        sa.Column("parent", sa.String(255), primary_key=True),
        sa.Column("child", sa.String(255), primary_key=True),
    )
    op.create_index("ix_cache_edges_child", "cache_edges", ["child"])
    op.create_table(
        "cache_meta",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
    )
    op.execute(sa.insert(lineage).from_select(
        ["key", "cost_seconds", "parents", "evicted_at"],
        sa.select(entries.c.key, sa.literal(0.0, sa.Float()), sa.literal("[]", sa.Text()),
                  sa.null())))


def downgrade() -> None:
    op.drop_table("cache_meta")
    op.drop_index("ix_cache_edges_child", "cache_edges")
    op.drop_table("cache_edges")
    op.drop_index("ix_cache_lineage_evicted_at", "cache_lineage")
    op.drop_table("cache_lineage")
    op.drop_index("ix_cache_entries_victim", "cache_entries")
    with op.batch_alter_table("cache_entries") as batch:
        for column in ("priority", "lost_cost_seconds", "freq_log", "created_seq", "pinned",
                       "lineage", "cost_seconds"):
            batch.drop_column(column)
