"""Scripts and clients for what runs beside the code (importable for tests and benchmarks)."""
