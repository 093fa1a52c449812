"""Dagster resources: the Spark session and the store of pipelines."""
