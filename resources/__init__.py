"""The shop demo's deployments, by name (``deployments.py``)."""
