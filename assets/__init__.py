"""Dagster assets: the output views of the pipelines."""
