"""Lifecycle services: one module per verb. They import no vendor library."""
