"""Managed login: vault, TOTP and login flows. Secrets never leave this package."""
