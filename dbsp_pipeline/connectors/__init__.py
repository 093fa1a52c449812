"""Connectors: move records between the outside world and a pipeline's input and output logs."""
