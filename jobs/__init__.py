"""Dagster jobs of a pipeline: step (an asset job), checkpoint, recover, restore."""
