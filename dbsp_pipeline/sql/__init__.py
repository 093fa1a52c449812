"""Spark SQL compiled to circuits: ``Circuit.from_sql(script)`` and ``circuit.view(name, sql)``.

Modules: ``script`` (CREATE TABLE / CREATE VIEW statements), ``query`` (one query onto the
circuit's operators), ``catalog`` (the relations SQL can name), ``errors`` (``SqlError``).
See ``docs/sql.md``.
"""

from dbsp_pipeline.sql.errors import SqlError

__all__ = ["SqlError"]
