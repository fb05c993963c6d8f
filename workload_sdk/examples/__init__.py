"""Example workloads (used by the docs and the tests)."""
