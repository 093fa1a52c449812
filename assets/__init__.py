"""The shop demo's pipelines (``shop.py``)."""
