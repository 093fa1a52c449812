"""Spark SQL filter predicates and simple projections evaluated by pyarrow compute, where the two
agree exactly: the driver path's way around a DuckDB query for the commonest small forms.

A DuckDB query costs about 2 ms here whatever its size (parsing, binding, planning, the Arrow
scan), more than all the other operators of a 10k-row step of the shop circuit together; pyarrow
filters 10k rows in about 0.1 ms. So a ``filter`` or ``select`` whose expression is in the small
subset below runs in pyarrow (``operators/linear.py``); any other goes through
``driver.expressions`` (DuckDB) or Spark, as before.

Contract:

* ``arrow_predicate(text, schema)``: a function of a table with ``schema``'s columns giving a
  boolean array that is TRUE, FALSE or NULL on exactly the rows where Spark's ``F.expr(text)``
  is (``Table.filter`` keeps the TRUE rows, as ``WHERE`` does), or None. Only for a predicate
  ``expressions.translate_predicate`` accepts (so it is on that module's whitelist, checked
  against Spark), that references a column, and built only from:

  - columns of type int, bigint, double, string (UTF8_BINARY), boolean, date;
  - literals: integers, ``TRUE``/``FALSE``, strings, doubles (``1e3``), decimal literals of at
    most 15 digits compared with a double (Spark compares those as doubles), and the constants
    ``expressions`` folds as Spark does (a date literal plus or minus whole days, months or
    years; decimal literals added, subtracted, multiplied);
  - ``= == <> != < <= > >=`` between integers, between a double and a number (an integer
    becomes a double, as Spark casts it), between strings (bytewise in both), between booleans,
    between dates; ``BETWEEN`` (``x >= lo AND x <= hi``, as Spark defines it); ``x [NOT] IN``
    a list of at most ``IN_ITEMS`` literals, none NULL (``x = a OR x = b ...``); ``AND OR NOT``
    (three-valued: pyarrow's Kleene kernels); ``IS [NOT] NULL`` of any of these;
  - ``+ - *`` of two numbers at least one of which is a double column or such a sum (an
    integer becomes a double, as Spark casts it; a decimal literal the double Spark casts it
    to), and ``-`` of a double: IEEE arithmetic in both (NaN and infinities propagate alike;
    Java's doubles are IEEE 754). Integer arithmetic is refused (ANSI Spark raises on
    overflow), as are division (Spark raises on a zero divisor) and arithmetic of literals
    alone.

  Spark orders NaN above every other double and equal to itself, where an IEEE comparison (as
  pyarrow's) is false whenever NaN is an operand. So a comparison of doubles is built from IEEE
  ones and ``is_nan``: ``a = b`` is ``(a = b) OR (is_nan(a) AND is_nan(b))``, ``a < b`` is
  ``(a < b) OR (NOT is_nan(a) AND is_nan(b))``, the others from these two (a literal is never
  NaN: its terms drop). A NULL operand gives NULL through all of them, as in SQL. ``-0.0`` equals
  ``0.0`` in both.
* ``arrow_projection(exprs, schema, names)``: for each output column a function of a table
  giving its values (an array, or a scalar for a literal) as Spark's ``F.expr`` gives them
  before its output types are applied (``sql.conform`` casts them): a bare column reference of
  any type (possibly aliased), a literal integer, double, string or boolean, or an expression
  of the predicates' operands above (a sum of doubles, a comparison); None unless every
  expression is one of these.

Tested against Spark on the edge rows of ``tests/driver/test_expressions.py`` (NULL, NaN, ±inf,
-0.0, integers near the limits, doubles past 2**53, non-ASCII strings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType
from sqlglot import exp

from dbsp_pipeline.driver.expressions import (
    BIGINT,
    BOOLEAN,
    DATE,
    DECIMAL_LIT,
    DOUBLE,
    INT,
    STRING,
    Columns,
    _column_name,
    _columns,
    _folded_constant,
    _folded_date,
    _folded_decimal,
    _int_literal,
    _is_literal,
    _is_number,
    _literal,
    _only,
    _parse,
    _Refuse,
    _unparen,
    translate_predicate,
    translate_projection,
)

__all__ = ["ArrowColumn", "ArrowPredicate", "arrow_predicate", "arrow_projection"]

#: a predicate evaluated over a table: one boolean value per row (NULL: not TRUE)
ArrowPredicate = Callable[[pa.Table], Any]
#: an output column of a projection evaluated over a table: an array, or a scalar (a literal)
ArrowColumn = Callable[[pa.Table], Any]

_INTEGERS = {INT, BIGINT}
_COLUMN_TYPES = {INT, BIGINT, DOUBLE, STRING, BOOLEAN, DATE}
#: the types of the computed columns and literals a projection takes
_PROJECTED_TYPES = {INT, BIGINT, DOUBLE, STRING, BOOLEAN}
_ARITHMETIC: dict[type[exp.Expression], Callable[[Any, Any], Any]] = {
    exp.Add: pc.add, exp.Sub: pc.subtract, exp.Mul: pc.multiply}
#: the most items of an ``IN`` list taken: it is evaluated as ``x = a OR x = b ...``, two
#: pyarrow calls an item, and beyond a few dozen items DuckDB's one query costs less
IN_ITEMS = 32
_EQ, _NE, _LT, _LE, _GT, _GE = "=", "<>", "<", "<=", ">", ">="
_KINDS: dict[type[exp.Expression], str] = {exp.EQ: _EQ, exp.NEQ: _NE, exp.LT: _LT,
                                           exp.LTE: _LE, exp.GT: _GT, exp.GTE: _GE}
_IEEE = {_EQ: pc.equal, _NE: pc.not_equal, _LT: pc.less, _LE: pc.less_equal, _GT: pc.greater,
         _GE: pc.greater_equal}


@dataclass(frozen=True)
class _Operand:
    """A sub-expression: its evaluation over a table, its type tag, and whether it is a
    literal (a scalar, never NaN)."""

    value: Callable[[pa.Table], Any]
    typ: str
    literal: bool


def arrow_predicate(text: str, schema: StructType) -> ArrowPredicate | None:
    """The predicate ``text`` as a function of a table (see the module docstring), or None."""
    if translate_predicate(text, schema) is None:
        return None
    columns = _columns(schema)
    if columns is None:
        return None
    try:
        operand = _walk(_parse(text), columns)
    except Exception:  # _Refuse, RecursionError on absurdly deep input, anything unforeseen
        return None
    if operand.typ != BOOLEAN or operand.literal:
        return None
    return operand.value


def arrow_projection(exprs: Sequence[str], schema: StructType,
                     names: Sequence[str]) -> list[ArrowColumn] | None:
    """For each of ``exprs`` (output column ``names[k]``), its values as a function of a table
    (see the module docstring); None unless pyarrow computes every one as Spark does."""
    if translate_projection(exprs, schema, names) is None:
        return None
    columns = _columns(schema)
    if columns is None:
        return None
    out: list[ArrowColumn] = []
    try:
        for text in exprs:
            node = _parse(text)
            if type(node) is exp.Alias:
                node = node.this
            node = _unparen(node)
            if type(node) is exp.Column:  # any type, as it is
                out.append(_picked(_column_name(node, columns)[0]))
                continue
            operand = _walk(node, columns)
            if operand.typ not in _PROJECTED_TYPES:  # (a decimal literal is a decimal)
                return None
            out.append(operand.value)
    except Exception:  # noqa: BLE001 (as above: not a projection pyarrow takes)
        return None
    return out


def _picked(name: str) -> ArrowColumn:
    return lambda table: table.column(name)


# --- the walk ----------------------------------------------------------------------------------

def _walk(node: exp.Expression, columns: Columns) -> _Operand:
    t: type[exp.Expression] = type(node)
    if t is exp.Paren:
        return _walk(_unparen(node), columns)
    if t is exp.Column:
        name, typ = _column_name(cast(exp.Column, node), columns)
        if typ not in _COLUMN_TYPES:
            raise _Refuse(f"column type {typ}")
        return _Operand(lambda table: table.column(name), typ, False)
    if t in (exp.Literal, exp.Boolean) or (t is exp.Neg and _is_number(node.this)):
        return _literal_operand(node)
    if _folded_constant(node) is not None:  # a date, a date +/- an interval, a decimal sum
        return _constant_operand(node)
    if t is exp.In:
        _only(node, "this", "expressions")
        items = node.expressions
        if not items or len(items) > IN_ITEMS or not all(_is_literal(i) for i in items):
            raise _Refuse("IN list")
        x = _walk(node.this, columns)
        equal = [_compare(_EQ, x, _walk(item, columns)) for item in items]
        return _Operand(lambda table: _any(e.value(table) for e in equal), BOOLEAN,
                        all(e.literal for e in equal))
    if t in _KINDS:
        _only(node, "this", "expression")
        return _compare(_KINDS[t], _walk(node.this, columns), _walk(node.expression, columns))
    if t in (exp.And, exp.Or):
        _only(node, "this", "expression")
        a, b = _boolean(node.this, columns), _boolean(node.expression, columns)
        fn = pc.and_kleene if t is exp.And else pc.or_kleene
        return _Operand(lambda table: fn(a.value(table), b.value(table)), BOOLEAN,
                        a.literal and b.literal)
    if t is exp.Not:
        _only(node, "this")
        a = _boolean(node.this, columns)
        return _Operand(lambda table: pc.invert(a.value(table)), BOOLEAN, a.literal)
    if t is exp.Is:
        _only(node, "this", "expression")
        if type(node.expression) is not exp.Null:
            raise _Refuse("IS TRUE / IS FALSE / IS <expr>")
        a = _walk(node.this, columns)
        return _Operand(lambda table: pc.is_null(a.value(table)), BOOLEAN, a.literal)
    if t in _ARITHMETIC:
        _only(node, "this", "expression")
        return _arithmetic(_ARITHMETIC[t], _walk(node.this, columns),
                           _walk(node.expression, columns))
    if t is exp.Neg:  # (a negated number literal is a literal, above)
        _only(node, "this")
        a = _walk(node.this, columns)
        if a.typ != DOUBLE or a.literal:
            raise _Refuse(f"negation of {a.typ}")
        return _Operand(lambda table: pc.negate(a.value(table)), DOUBLE, False)
    if t is exp.Between:
        _only(node, "this", "low", "high")
        x = _walk(node.this, columns)
        low = _compare(_GE, x, _walk(node.args["low"], columns))
        high = _compare(_LE, x, _walk(node.args["high"], columns))
        return _Operand(lambda table: pc.and_kleene(low.value(table), high.value(table)),
                        BOOLEAN, low.literal and high.literal)
    raise _Refuse(f"node {t.__name__}")


def _boolean(node: exp.Expression, columns: Columns) -> _Operand:
    operand = _walk(node, columns)
    if operand.typ != BOOLEAN:
        raise _Refuse(f"operand type {operand.typ}")
    return operand


def _literal_operand(node: exp.Expression) -> _Operand:
    """A literal as a scalar, typed as ``expressions._literal`` types it (which also checks it)."""
    _, typ = _literal(node)
    if typ == BOOLEAN:
        scalar = pa.scalar(node.this is True, pa.bool_())
    elif typ == STRING:
        scalar = pa.scalar(str(node.this), pa.string())
    elif typ in _INTEGERS:
        value = _int_literal(node)
        if value is None:
            raise _Refuse("integer literal")
        scalar = pa.scalar(value, pa.int64())
    elif typ in (DECIMAL_LIT, DOUBLE):
        negative = type(node) is exp.Neg
        text = str((node.this if negative else node).this)
        number = float(Decimal(text)) if typ == DECIMAL_LIT else float(text)
        number = -number if negative else number
        if typ == DECIMAL_LIT:  # a decimal has no negative zero: -0.0 is the double 0.0
            number += 0.0
        scalar = pa.scalar(number, pa.float64())
    else:
        raise _Refuse(f"literal of type {typ}")
    return _Operand(lambda table: scalar, typ, True)


def _constant_operand(node: exp.Expression) -> _Operand:
    """A constant Spark folds: a date literal (plus or minus whole days, months, years), or
    decimal literals added, subtracted or multiplied (exactly, then as the double Spark
    compares with a double)."""
    _, typ = _folded_constant(node) or ("", "")
    if typ == DATE:
        day = _folded_date(node)
        scalar = pa.scalar(day, pa.date32())
    elif typ == DECIMAL_LIT:
        value = _folded_decimal(node)
        if value is None:
            raise _Refuse("folded decimal")
        scalar = pa.scalar(float(value), pa.float64())
    else:
        raise _Refuse(f"constant of type {typ}")
    return _Operand(lambda table: scalar, typ, True)


def _any(values: Any) -> Any:
    """The three-valued OR of ``values`` (at least one)."""
    out = None
    for value in values:
        out = value if out is None else pc.or_kleene(out, value)
    return out


def _compare(kind: str, a: _Operand, b: _Operand) -> _Operand:
    """``a <kind> b`` with Spark's semantics, for the operand types of the module docstring."""
    kinds = {a.typ, b.typ}
    literal = a.literal and b.literal
    if kinds <= _INTEGERS or (a.typ == b.typ and a.typ in (STRING, BOOLEAN, DATE)):
        ieee = _IEEE[kind]
        return _Operand(lambda table: ieee(a.value(table), b.value(table)), BOOLEAN, literal)
    if DOUBLE in kinds and kinds <= {INT, BIGINT, DOUBLE, DECIMAL_LIT}:
        return _Operand(_doubles(kind, _as_double(a), _as_double(b)), BOOLEAN, literal)
    raise _Refuse(f"comparison {a.typ} vs {b.typ}")


def _arithmetic(fn: Callable[[Any, Any], Any], a: _Operand, b: _Operand) -> _Operand:
    """``fn`` (IEEE ``+ - *``) of two numbers as Spark computes them when one is a double: both
    as doubles. Refused for integers alone (Spark raises on overflow) and literals alone."""
    kinds = {a.typ, b.typ}
    if DOUBLE not in kinds or not kinds <= {INT, BIGINT, DOUBLE, DECIMAL_LIT} or (
            a.literal and b.literal):
        raise _Refuse(f"arithmetic of {a.typ} and {b.typ}")
    x, y = _as_double(a), _as_double(b)
    return _Operand(lambda table: fn(x.value(table), y.value(table)), DOUBLE, False)


def _as_double(a: _Operand) -> _Operand:
    """``a`` as a double, as Spark casts an integer compared with, added to, subtracted from or
    multiplied by a double (to the nearest)."""
    if a.typ in (DOUBLE, DECIMAL_LIT):
        return a
    return _Operand(lambda table: pc.cast(a.value(table), pa.float64(), safe=False), DOUBLE,
                    a.literal)


def _doubles(kind: str, a: _Operand, b: _Operand) -> Callable[[pa.Table], Any]:
    """A comparison of doubles with NaN equal to itself and above every other value."""
    def equal(x: _Operand, y: _Operand, table: pa.Table) -> Any:
        ieee = pc.equal(x.value(table), y.value(table))
        if x.literal or y.literal:
            return ieee
        return pc.or_kleene(ieee, pc.and_kleene(pc.is_nan(x.value(table)),
                                                pc.is_nan(y.value(table))))

    def less(x: _Operand, y: _Operand, table: pa.Table) -> Any:
        ieee = pc.less(x.value(table), y.value(table))
        if y.literal:  # y is not NaN: x < y only as IEEE has it (a NaN x is not below)
            return ieee
        below_nan = pc.is_nan(y.value(table))
        if not x.literal:
            below_nan = pc.and_kleene(pc.invert(pc.is_nan(x.value(table))), below_nan)
        return pc.or_kleene(ieee, below_nan)

    if kind == _EQ:
        return lambda table: equal(a, b, table)
    if kind == _NE:
        return lambda table: pc.invert(equal(a, b, table))
    if kind == _LT:
        return lambda table: less(a, b, table)
    if kind == _GT:
        return lambda table: less(b, a, table)
    if kind == _LE:
        return lambda table: pc.or_kleene(equal(a, b, table), less(a, b, table))
    return lambda table: pc.or_kleene(equal(a, b, table), less(b, a, table))
