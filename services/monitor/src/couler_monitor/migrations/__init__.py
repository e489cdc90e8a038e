"""The monitor's alembic revisions (``versions/``), run at start by the store helper."""
