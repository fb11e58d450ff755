"""PostgreSQL backend: one database shared by every worker on every machine."""

from agent.storage.postgres.store import DATABASE_URL_SETTING, PostgresStore, RetryPolicy

__all__ = ["DATABASE_URL_SETTING", "PostgresStore", "RetryPolicy"]
