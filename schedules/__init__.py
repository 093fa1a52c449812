"""Dagster schedules of a pipeline."""
