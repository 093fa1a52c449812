"""Dagster sensors of a pipeline: input arrival and recovery after a failed run."""
