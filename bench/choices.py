"""The benchmarks' choices as the CLI offers them, importable without the benchmarks
themselves (``outloop --help`` and every other command start without loading them)."""

from __future__ import annotations

CLAIM_MODES = ("claim", "intake")
STORE_BACKENDS = ("sqlite", "postgres")
SEND_MAILBOXES = ("file", "memory")
IMAP_PROVIDERS = ("imap",)
"""The mail systems the IMAP intake bench can measure (a standards IMAP server)."""
API_PROVIDERS = ("gmail", "graph")
"""The mail systems the API intake bench can measure, by the CLI's names."""
INTAKE_ROUNDS = 2
