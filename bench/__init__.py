"""Benchmarks that print JSON: each measures a baseline in the same run and the ratio to it."""
