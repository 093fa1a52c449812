"""SQL text declared on a circuit: ``CREATE TABLE`` inputs and ``CREATE [MATERIALIZED] VIEW``
outputs.

``declare_script`` reads a script of statements separated by ``;`` (Spark SQL, parsed by
sqlglot): each ``CREATE TABLE name (columns)`` declares an input (its columns as a Spark DDL
schema), each ``CREATE VIEW name AS query`` compiles the query (``query.QueryCompiler``) and
declares the result as the output view ``name``. A view may read the tables and the views
declared before it. ``declare_view`` does the same for one query on a circuit built in Python.

Errors are ``SqlError`` with the view's name and the line and column in the text given. A
statement that fails declares nothing; the statements before it stay declared.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dbsp_pipeline.circuit import Circuit
from dbsp_pipeline.sql.catalog import Catalog, column_defs
from dbsp_pipeline.sql.errors import SqlError
from dbsp_pipeline.sql.query import QueryCompiler, copy_meta


def declare_script(circuit: Circuit, text: str) -> None:
    """Declare every statement of ``text`` on ``circuit`` (see the module docstring)."""
    for statement in _parse(text, circuit.name, many=True):
        if isinstance(statement, exp.Create):
            kind = (statement.args.get("kind") or "").upper()
            if kind == "TABLE":
                _declare_table(circuit, statement)
                continue
            if kind == "VIEW":
                name = statement.this.name if isinstance(statement.this, exp.Table) else ""
                _declare_query(circuit, name, statement.expression, statement)
                continue
        raise SqlError(circuit.name, statement,
                       f"{type(statement).__name__.upper()} statement is not supported",
                       "a script holds CREATE TABLE name (columns) and "
                       "CREATE [MATERIALIZED] VIEW name AS SELECT ...")


def declare_view(circuit: Circuit, name: str, query: str) -> None:
    """Compile ``query`` (one SELECT, Spark SQL) and declare it as output ``name``."""
    statements = _parse(query, name, many=False)
    if len(statements) != 1:
        raise SqlError(name, None, f"expected one query, got {len(statements)} statements")
    _declare_query(circuit, name, statements[0], statements[0])


def _parse(text: str, what: str, many: bool) -> list[exp.Expr]:
    if not isinstance(text, str) or not text.strip():
        raise SqlError(what, None, "the SQL text is empty")
    try:
        parsed = sqlglot.parse(text, read="spark")
    except sqlglot.errors.ParseError as e:
        first = e.errors[0] if e.errors else {}
        line, col = first.get("line"), first.get("col")
        where = f" at line {line}, column {col}" if line is not None else ""
        raise SqlError(what, None, f"the SQL does not parse{where}: "
                       f"{first.get('description') or e}",
                       "the dialect is Spark SQL") from None
    return [s for s in parsed if s is not None]


def _declare_table(circuit: Circuit, create: exp.Create) -> None:
    schema = create.this
    if not isinstance(schema, exp.Schema) or not isinstance(schema.this, exp.Table):
        raise SqlError(circuit.name, create, "CREATE TABLE needs a column list",
                       "CREATE TABLE name (col TYPE, ...)")
    name = schema.this.name
    defs = [d for d in schema.expressions if isinstance(d, exp.ColumnDef)]
    if len(defs) != len(schema.expressions):
        other = next(d for d in schema.expressions if not isinstance(d, exp.ColumnDef))
        raise SqlError(name, other, "table constraints are not supported",
                       "declare columns only (NOT NULL goes with a column)")
    for d in defs:
        if d.args.get("kind") is None:
            raise SqlError(name, d, f"column '{d.name}' has no type")
    _, not_null = column_defs(defs)
    ddl = ", ".join(f"{exp.to_identifier(d.name, quoted=True).sql(dialect='spark')} "
                    f"{d.args['kind'].sql(dialect='spark')}"
                    f"{' NOT NULL' if d.name.lower() in not_null else ''}" for d in defs)
    circuit.input(name, ddl)


def _declare_query(circuit: Circuit, name: str, query: exp.Expr | None,
                   statement: exp.Expr) -> None:
    if not name:
        raise SqlError(circuit.name, statement, "CREATE VIEW needs a name")
    if query is None:
        raise SqlError(name, statement, "CREATE VIEW needs AS SELECT ...")
    compiler = QueryCompiler(name, Catalog.of(circuit))
    declared = len(circuit.nodes)
    try:
        compiled = query.copy()  # compiling rewrites some clauses (USING): keep the user's
        copy_meta(query, compiled)
        compiler.refuse_unsupported(compiled)
        relation = compiler.relation(compiled, {})
        circuit.output(name, relation.collection)
    except BaseException:
        del circuit.nodes[declared:]  # nothing reads them: the failed view leaves no trace
        raise
    circuit.sql_views[name] = relation.columns
    circuit.sql_texts[name] = query.sql(dialect="spark", pretty=True)
