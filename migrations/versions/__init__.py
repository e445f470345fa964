"""The revisions, oldest first (Alembic skips this file when it lists them)."""
