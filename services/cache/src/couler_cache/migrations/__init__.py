"""The cache's alembic revisions (``versions/``), run at start by ``store.migrate``."""
