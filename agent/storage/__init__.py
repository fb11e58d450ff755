"""Store backends: SQLite (the embedded default) and, at scale, PostgreSQL."""
