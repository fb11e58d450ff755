"""Playwright adapters implementing agent.ports.MailProvider (Outlook Web, Gmail web)."""
