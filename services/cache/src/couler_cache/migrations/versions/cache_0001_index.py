"""cache 1: the index (entries, their artifacts), counters, orphaned blobs and the outbox."""

import sqlalchemy as sa
from alembic import op

revision = "cache_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cache_entries",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("workflow", sa.String(255), nullable=False),
        sa.Column("step", sa.String(255), nullable=False),
        sa.Column("outputs", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=False),
        sa.Column("used_seq", sa.BigInteger(), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_cache_entries_used_seq", "cache_entries", ["used_seq"])
    op.create_table(
        "cache_artifacts",
        sa.Column("key", sa.String(255),
                  sa.ForeignKey("cache_entries.key", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
    )
    op.create_index("ix_cache_artifacts_digest", "cache_artifacts", ["digest"])
    counters = op.create_table(
        "cache_counters",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False),
    )
    # Seeded here so that counting is always a plain UPDATE (no insert race between replicas).
    op.bulk_insert(counters, [{"name": name, "value": 0} for name in
                              ("hits", "misses", "evictions", "evicted_bytes", "clock")])
    op.create_table(
        "cache_orphans",
        sa.Column("digest", sa.String(80), primary_key=True),
    )
    op.create_table(
        "cache_outbox",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("msg_id", sa.Text(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("cache_outbox")
    op.drop_table("cache_orphans")
    op.drop_table("cache_counters")
    op.drop_index("ix_cache_artifacts_digest", "cache_artifacts")
    op.drop_table("cache_artifacts")
    op.drop_index("ix_cache_entries_used_seq", "cache_entries")
    op.drop_table("cache_entries")
