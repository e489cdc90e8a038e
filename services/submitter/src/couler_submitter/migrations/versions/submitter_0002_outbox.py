"""submitter 2: step counts and change revisions for paging, and the events outbox."""

import sqlalchemy as sa
from alembic import op

revision = "submitter_0002"
down_revision = "submitter_0001"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: a ROWID alias


def upgrade() -> None:
    op.add_column("submitter_runs", sa.Column("step_count", sa.BigInteger(), nullable=False,
                                              server_default="0"))
    op.add_column("submitter_runs", sa.Column("cached_step_count", sa.BigInteger(),
                                              nullable=False, server_default="0"))
    # The run's revision when the step last changed: Watch sends what changed since.
    op.add_column("submitter_steps", sa.Column("revision", sa.BigInteger(), nullable=False,
                                               server_default="0"))
    op.execute("UPDATE submitter_steps SET revision = position")
    op.execute(
        "UPDATE submitter_runs SET "
        "step_count = (SELECT COUNT(*) FROM submitter_steps s "
        "WHERE s.run_id = submitter_runs.run_id), "
        "cached_step_count = (SELECT COUNT(*) FROM submitter_steps s "
        "WHERE s.run_id = submitter_runs.run_id AND s.state = 'cached')")
    op.create_index("ix_submitter_steps_position", "submitter_steps", ["run_id", "position"])
    op.create_index("ix_submitter_steps_revision", "submitter_steps", ["run_id", "revision"])
    # Events committed with the change they report, published (and deleted) in id order.
    op.create_table(
        "submitter_outbox",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("workflow", sa.String(255), nullable=False, server_default=""),
        sa.Column("engine", sa.String(32), nullable=False, server_default=""),
        sa.Column("retries", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("payload", sa.LargeBinary(), nullable=True),
        # The trace context of the change (JSON headers), so the event continues its trace.
        sa.Column("trace", sa.Text(), nullable=False, server_default=""),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text(), nullable=False, server_default=""),
    )
    # Events that can never be published, moved aside with the reason.
    op.create_table(
        "submitter_outbox_dead",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("outbox_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("workflow", sa.String(255), nullable=False, server_default=""),
        sa.Column("engine", sa.String(32), nullable=False, server_default=""),
        sa.Column("retries", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("payload", sa.LargeBinary(), nullable=True),
        sa.Column("trace", sa.Text(), nullable=False, server_default=""),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("moved_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("submitter_outbox_dead")
    op.drop_table("submitter_outbox")
    op.drop_index("ix_submitter_steps_revision", "submitter_steps")
    op.drop_index("ix_submitter_steps_position", "submitter_steps")
    op.drop_column("submitter_steps", "revision")
    op.drop_column("submitter_runs", "cached_step_count")
    op.drop_column("submitter_runs", "step_count")
