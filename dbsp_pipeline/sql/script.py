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

import logging
import re
import threading

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
        if isinstance(statement, exp.Command):  # what sqlglot could not parse as a statement
            raise SqlError(_statement_named(text, statement) or circuit.name, statement,
                           "the SQL does not parse as a statement (a misspelled keyword?)",
                           "a script holds CREATE TABLE name (columns) and "
                           "CREATE [MATERIALIZED] VIEW name AS SELECT ...")
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
        _PARSING.on = True
        parsed = sqlglot.parse(text, read="spark")
    except sqlglot.errors.ParseError as e:
        first = e.errors[0] if e.errors else {}
        line, col = first.get("line"), first.get("col")
        where = f" at line {line}, column {col}" if line is not None else ""
        if many and line is not None:  # the statement it is in names the view (or table)
            what = _name_before(text, int(line), int(col or 0)) or what
        raise SqlError(what, None, f"the SQL does not parse{where}: "
                       f"{_parse_problem(first) or e}",
                       "the dialect is Spark SQL") from None
    finally:
        _PARSING.on = False
    return [s for s in parsed if s is not None]


#: per thread: whether it is parsing a script (``_NoCommandFallbackWarning``)
_PARSING = threading.local()


class _NoCommandFallbackWarning(logging.Filter):
    """Drops sqlglot's warning that it reads a statement it cannot parse as a 'Command', while
    this module parses: ``declare_script`` refuses such a statement itself, naming it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_PARSING, "on", False)
                    and "Falling back to parsing as a 'Command'" in record.getMessage())


logging.getLogger("sqlglot").addFilter(_NoCommandFallbackWarning())


#: a statement's start, with the name it declares
_DECLARED = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:MATERIALIZED\s+)?(?:VIEW|TABLE)\s+"
                       r"(?:IF\s+NOT\s+EXISTS\s+)?`?(\w+)", re.IGNORECASE)
#: sqlglot's words for a clause it found incomplete: "Required keyword: 'this' missing for
#: <class 'sqlglot.expressions.query.Where'>"
_MISSING = re.compile(r"Required keyword: '\w+' missing for <class '[\w.]*?(\w+)'>")
#: how SQL spells the nodes sqlglot names there, where it is not their name upper-cased
_SPELLED = {"GT": ">", "GTE": ">=", "LT": "<", "LTE": "<=", "EQ": "=", "NEQ": "<>", "ADD": "+",
            "SUB": "-", "MUL": "*", "DIV": "/", "GROUP": "GROUP BY", "ORDER": "ORDER BY"}


def _name_before(text: str, line: int, col: int) -> str | None:
    """The name the statement around ``line``/``col`` of ``text`` declares (None if none)."""
    lines = text.split("\n")
    offset = sum(len(x) + 1 for x in lines[:max(0, line - 1)]) + col
    names = [m[1] for m in _DECLARED.finditer(text[:offset])]
    return names[-1] if names else None


def _statement_named(text: str, statement: exp.Expr) -> str | None:
    """The name a statement sqlglot could not parse declares, read from its text."""
    m = _DECLARED.search(statement.sql(dialect="spark"))
    return m[1] if m else None


def _parse_problem(error: dict[str, object]) -> str | None:
    """sqlglot's parse error in the user's terms: the clause left incomplete, near which
    text."""
    description = str(error.get("description") or "")
    near = str(error.get("highlight") or "").strip()
    m = _MISSING.search(description)
    if m:
        name = m[1].upper()
        description = f"{_SPELLED.get(name, name)} is incomplete (something is missing after it)"
    return (f"{description}, near '{near}'" if near else description) or None


#: why a key constraint is refused rather than ignored
_NOT_ENFORCED = ("PRIMARY KEY and UNIQUE are not enforced: a table is a multiset of rows, so a "
                 "push of a key already present adds a second row (an update is a delete of "
                 "the old row and an insert of the new one)")


def _declare_table(circuit: Circuit, create: exp.Create) -> None:
    schema = create.this
    if not isinstance(schema, exp.Schema) or not isinstance(schema.this, exp.Table):
        raise SqlError(circuit.name, create, "CREATE TABLE needs a column list",
                       "CREATE TABLE name (col TYPE, ...)")
    name = schema.this.name
    defs = [d for d in schema.expressions if isinstance(d, exp.ColumnDef)]
    if len(defs) != len(schema.expressions):
        other = next(d for d in schema.expressions if not isinstance(d, exp.ColumnDef))
        keys = (exp.PrimaryKey, exp.UniqueColumnConstraint)
        is_key = isinstance(other, keys) or any(isinstance(e, keys) for e in other.expressions)
        raise SqlError(name, other, "table constraints are not supported" + (
            f": {_NOT_ENFORCED}" if is_key else ""),
            "declare columns only (NOT NULL goes with a column)")
    for d in defs:
        if d.args.get("kind") is None:
            raise SqlError(name, d, f"column '{d.name}' has no type")
        for c in d.args.get("constraints") or []:
            kind = c.args.get("kind")
            if isinstance(kind, (exp.PrimaryKeyColumnConstraint, exp.UniqueColumnConstraint)):
                raise SqlError(name, c, f"column '{d.name}': {_NOT_ENFORCED}",
                               f"declare '{d.name}' without it")
            if isinstance(kind, (exp.CheckColumnConstraint, exp.DefaultColumnConstraint)):
                raise SqlError(name, c, f"column '{d.name}': CHECK and DEFAULT are not "
                               "supported (a push is checked against the column's type and "
                               "NOT NULL only, and names every column)",
                               f"declare '{d.name}' without it")
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
