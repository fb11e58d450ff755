"""Outloop's provider-neutral core: domain rules, lifecycle services, ports and adapters."""
