"""Alembic revisions of the submitter's tables (run by ``couler_runtime.store.migrate``)."""
