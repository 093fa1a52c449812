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

  - columns of type int, bigint, double, string (UTF8_BINARY), boolean, date, timestamp,
    timestamp_ntz, decimal; under ``IS [NOT] NULL`` a bare column of any type ``expressions``
    takes (tinyint, smallint, float, binary too: only validity is read);
  - literals: integers, ``TRUE``/``FALSE``, strings, doubles (``1e3``), ``NULL`` (in CASE and
    COALESCE only), decimal literals of at most 15 digits compared with a double (Spark compares
    those as doubles) or a decimal, and the constants ``expressions`` folds as Spark does (a date
    literal plus or minus whole days, months or years; decimal literals added, subtracted,
    multiplied); ``CAST(x AS INT|BIGINT|DOUBLE)`` of an integer (``CAST(0 AS BIGINT)``, ``1L``)
    or a double (an int of a bigint out of range raises ``ArrowInvalid``, as Spark raises);
  - ``= == <> != < <= > >=`` between integers, between a double and a number (an integer
    becomes a double, as Spark casts it), between strings (bytewise in both), between booleans,
    between dates, between timestamps (timestamp_ntz) of the same type (microseconds in both),
    between decimals of one scale and between a decimal and an integer or decimal literal of at
    most its scale (exact in both: ``_decimal_comparison``); ``BETWEEN`` (``x >= lo AND x <=
    hi``, as Spark defines it); ``x [NOT] IN`` a list of at most ``IN_ITEMS`` literals, none
    NULL (``x = a OR x = b ...``); ``AND OR NOT`` (three-valued: pyarrow's Kleene kernels);
    ``IS [NOT] NULL`` of any of these;
  - ``CASE [x] WHEN c THEN a ... [ELSE b] END`` and ``if(c, a, b)`` (the first TRUE condition's
    value: a NULL condition is not TRUE, as in Spark; ``CASE x WHEN v`` is ``x = v``) and
    ``COALESCE``/``nvl``/``ifnull`` whose values are operands of this list of one type (a
    decimal of one precision and scale), int with bigint (a bigint), or numbers with a double
    (a double, as ``_as_double``); a NULL takes the others' type (``CASE WHEN false THEN col
    END`` is a typed NULL column); other mixes (a decimal with an integer, a decimal literal
    without a double) refuse, as they widen otherwise in Spark;
  - ``round(x[, scale])`` of a double to a literal scale from -15 to 15 by the formula of
    ``expressions._rounded`` (Spark's bits; +0.0 for zero), raising ``ArrowInvalid`` on a step
    with a value past its bound (DuckDB raises there too, then Spark decides); of an int or a
    bigint to a scale >= 0, itself;
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
  of the predicates' operands above (a sum of doubles, a comparison, a CASE, a COALESCE, a
  CAST, a round) of a type other than a decimal literal; None unless every expression is one
  of these.

Refused (DuckDB or Spark): integer arithmetic, division, functions but ``round``, ``bround``,
``round`` of a decimal, decimals against doubles or integer columns or of different scales,
timestamps against dates or strings, NULL-safe comparisons, LIKE.

Tested against Spark on the edge rows of ``tests/driver/test_expressions.py`` (NULL, NaN, ±inf,
-0.0, integers near the limits, doubles past 2**53, non-ASCII strings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal, localcontext
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
    NULL,
    ROUND_SCALES,
    STRING,
    TIMESTAMP,
    TIMESTAMP_NTZ,
    Columns,
    _column_name,
    _columns,
    _decimal_of,
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
    round_bound,
    translate_predicate,
    translate_projection,
)

__all__ = ["ArrowColumn", "ArrowPredicate", "arrow_predicate", "arrow_projection"]

#: a predicate evaluated over a table: one boolean value per row (NULL: not TRUE)
ArrowPredicate = Callable[[pa.Table], Any]
#: an output column of a projection evaluated over a table: an array, or a scalar (a literal)
ArrowColumn = Callable[[pa.Table], Any]

_INTEGERS = {INT, BIGINT}
#: the column types taking part in expressions (and decimals: ``_decimal_of`` of the tag)
_COLUMN_TYPES = {INT, BIGINT, DOUBLE, STRING, BOOLEAN, DATE, TIMESTAMP, TIMESTAMP_NTZ}
#: the types compared only with themselves, as both engines compare them
_SELF_COMPARED = {STRING, BOOLEAN, DATE, TIMESTAMP, TIMESTAMP_NTZ}
#: the Arrow type of each type tag's values (``zset.spark_to_arrow_schema``'s); a decimal's
#: is ``_arrow_type``'s
_ARROW_TYPES = {INT: pa.int32(), BIGINT: pa.int64(), DOUBLE: pa.float64(), STRING: pa.string(),
                BOOLEAN: pa.bool_(), DATE: pa.date32(), TIMESTAMP: pa.timestamp("us", "UTC"),
                TIMESTAMP_NTZ: pa.timestamp("us")}
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
    #: a number literal's exact value (an integer or a decimal literal as written), else None
    exact: Decimal | None = None


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
            if operand.typ not in _ARROW_TYPES and _decimal_of(operand.typ) is None:
                return None  # a decimal literal (Spark's decimal), an untyped NULL
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
        if typ not in _COLUMN_TYPES and _decimal_of(typ) is None:
            raise _Refuse(f"column type {typ}")
        return _Operand(lambda table: table.column(name), typ, False)
    if t is exp.Null:
        _only(node)
        return _Operand(lambda table: pa.scalar(None), NULL, True)
    if t in (exp.Literal, exp.Boolean) or (t is exp.Neg and _is_number(node.this)):
        return _literal_operand(node)
    if _folded_constant(node) is not None:  # a date, a date +/- an interval, a decimal sum
        return _constant_operand(node)
    if t in (exp.Cast, exp.TryCast):  # (sqlglot reads Spark's CAST as TRY_CAST)
        return _cast(node, columns)
    if t is exp.Case:
        return _case(cast(exp.Case, node), columns)
    if t is exp.If:  # if(c, a, b): CASE WHEN c THEN a ELSE b END
        _only(node, "this", "true", "false")
        return _branches([(_boolean(node.this, columns), _walk(node.args["true"], columns))],
                         _walk(node.args["false"], columns) if node.args.get("false")
                         is not None else None)
    if t is exp.Coalesce:
        return _coalesce(node, columns)
    if t is exp.Round:
        _only(node, "this", "decimals")
        return _rounded(_walk(node.this, columns), node.args.get("decimals"))
    if t is exp.In:
        _only(node, "this", "expressions")
        items = node.expressions
        if not items or len(items) > IN_ITEMS or not all(_is_literal(i) for i in items):
            raise _Refuse("IN list")
        x = _walk(node.this, columns)
        operands = [_walk(item, columns) for item in items]
        kinds = {x.typ, *(o.typ for o in operands)}
        if DOUBLE in kinds and kinds <= {INT, BIGINT, DOUBLE, DECIMAL_LIT}:
            # Spark compares the value and every item in their common type, a double: an
            # integer item too (9007199254740993 IN (9007199254740992, 1e0) is TRUE)
            x, operands = _as_double(x), [_as_double(o) for o in operands]
        equal = [_compare(_EQ, x, o) for o in operands]
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
        a = _null_tested(node.this, columns)
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
        return _Operand(lambda table: scalar, typ, True, Decimal(value))
    elif typ in (DECIMAL_LIT, DOUBLE):
        negative = type(node) is exp.Neg
        text = str((node.this if negative else node).this)
        number = float(Decimal(text)) if typ == DECIMAL_LIT else float(text)
        number = -number if negative else number
        if typ == DECIMAL_LIT:  # a decimal has no negative zero: -0.0 is the double 0.0
            number += 0.0
            exact = -Decimal(text) if negative else Decimal(text)
            return _Operand(lambda table: pa.scalar(number, pa.float64()), typ, True, exact)
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


def _null_tested(node: exp.Expression, columns: Columns) -> _Operand:
    """The operand of ``IS [NOT] NULL``: a bare column of any type ``expressions`` takes (its
    values are not read, only their validity, the same in both), else an operand of the walk."""
    bare = _unparen(node)
    if isinstance(bare, exp.Column) and type(bare) is exp.Column:
        name, typ = _column_name(bare, columns)
        return _Operand(lambda table: table.column(name), typ, False)
    return _walk(node, columns)


#: the casts taken: target type -> the operand types it takes (values kept exactly; an int
#: of a bigint raises ``ArrowInvalid`` out of range, as Spark's ANSI cast raises)
_CASTS = {exp.DataType.Type.INT: (INT, _INTEGERS), exp.DataType.Type.BIGINT: (BIGINT, _INTEGERS),
          exp.DataType.Type.DOUBLE: (DOUBLE, {INT, BIGINT, DOUBLE})}


def _cast(node: exp.Expression, columns: Columns) -> _Operand:
    """``CAST(x AS INT|BIGINT|DOUBLE)`` of an integer (``CAST(0 AS BIGINT)``, ``1L``) or a double
    (to DOUBLE): the value as it is, or to the nearest double, as Spark casts (``_as_double``);
    a bigint to an int out of range raises (Spark's ANSI cast raises too)."""
    _only(node, "this", "to")
    to = node.args["to"]
    if type(to) is not exp.DataType or to.expressions or to.this not in _CASTS:
        raise _Refuse("CAST type")
    typ, takes = _CASTS[to.this]
    a = _walk(node.this, columns)
    if a.typ not in takes:
        raise _Refuse(f"CAST of {a.typ}")
    if typ == DOUBLE:
        return _as_double(a)
    target = _ARROW_TYPES[typ]
    exact = a.exact
    if exact is not None and not (-(2**31) <= exact < 2**31 if typ == INT
                                  else -(2**63) <= exact < 2**63):
        raise _Refuse("CAST of a literal out of the type's range (Spark raises)")
    return _Operand(lambda table: pc.cast(a.value(table), target), typ, a.literal, exact)


def _case(node: exp.Case, columns: Columns) -> _Operand:
    """``CASE [x] WHEN c THEN a ... [ELSE b] END``: the first branch whose condition is TRUE
    (``CASE x WHEN v`` is ``x = v``, as Spark rewrites it), else the ELSE value or NULL."""
    _only(node, "this", "ifs", "default")
    ifs = node.args.get("ifs") or []
    if not ifs:
        raise _Refuse("CASE without WHEN")
    subject = None if node.this is None else _walk(node.this, columns)
    branches = []
    for branch in ifs:
        if type(branch) is not exp.If:
            raise _Refuse("CASE branch form")
        _only(branch, "this", "true")
        cond = (_boolean(branch.this, columns) if subject is None
                else _compare(_EQ, subject, _walk(branch.this, columns)))
        branches.append((cond, _walk(branch.args["true"], columns)))
    default = node.args.get("default")
    return _branches(branches, None if default is None else _walk(default, columns))


def _branches(branches: Sequence[tuple[_Operand, _Operand]], default: _Operand | None
              ) -> _Operand:
    """The CASE of ``branches`` (condition, value) and ``default``, evaluated from the last
    branch up as ``if_else(coalesce(c, FALSE), a, rest)``: a NULL condition is not TRUE, as in
    Spark. The values are of Spark's common type (``_unified``)."""
    conditions = [c for c, _ in branches]
    typ, values = _unified([*(v for _, v in branches),
                            default or _Operand(lambda table: pa.scalar(None), NULL, True)])

    def evaluated(table: pa.Table) -> Any:
        out = values[-1].value(table)
        for cond, value in zip(reversed(conditions), reversed(values[:-1])):
            out = pc.if_else(pc.fill_null(cond.value(table), False), value.value(table), out)
        return out

    literal = all(c.literal for c in conditions) and all(v.literal for v in values)
    return _Operand(evaluated, typ, literal)


def _coalesce(node: exp.Expression, columns: Columns) -> _Operand:
    """``COALESCE(a, b, ...)`` (``nvl``, ``ifnull``): the first value not NULL (NaN is not NULL in
    either), of Spark's common type (``_unified``)."""
    _only(node, "this", "expressions", "is_nvl", "is_null")
    typ, values = _unified([_walk(a, columns) for a in [node.this, *node.expressions]])
    return _Operand(lambda table: pc.coalesce(*(v.value(table) for v in values)), typ,
                    all(v.literal for v in values))


def _unified(values: Sequence[_Operand]) -> tuple[str, list[_Operand]]:
    """Spark's common type of CASE branches or COALESCE arguments and each value cast to it
    (to its Arrow type, so pyarrow's kernels take them together), where the cast keeps every
    value as Spark's does: one type (a decimal of one precision and scale), int with bigint a
    bigint, integers, decimal literals and doubles a double (``_as_double``: as Spark casts
    them); a NULL takes the others' type. Anything else refuses (all NULL: no type)."""
    real = {v.typ for v in values if v.typ != NULL}
    if len(real) == 1 and DECIMAL_LIT not in real:
        typ = real.pop()
    elif real and real <= _INTEGERS:
        typ = BIGINT
    elif DOUBLE in real and real <= {INT, BIGINT, DOUBLE, DECIMAL_LIT}:
        typ = DOUBLE
    else:
        raise _Refuse(f"branch types {sorted(real)}")
    target = _arrow_type(typ)
    return typ, [_cast_to(_as_double(v) if typ == DOUBLE and v.typ != NULL else v, typ, target)
                 for v in values]


def _cast_to(a: _Operand, typ: str, target: pa.DataType) -> _Operand:
    """``a``'s values cast to ``target`` (a widening that keeps them, or a NULL typed)."""
    return _Operand(lambda table: pc.cast(a.value(table), target), typ, a.literal)


def _arrow_type(typ: str) -> pa.DataType:
    decimal = _decimal_of(typ)
    if decimal is not None:
        return pa.decimal128(*decimal)
    if typ not in _ARROW_TYPES:
        raise _Refuse(f"type {typ}")
    return _ARROW_TYPES[typ]


def _rounded(a: _Operand, scale_node: exp.Expression | None) -> _Operand:
    """Spark's ``round(x, scale)`` (half up) of a double to a literal scale (0 when omitted), by
    exactly the formula of ``expressions._rounded`` (whose docstring shows it is Spark's, bit for
    bit): with ``x = |a|`` and ``k = floor(x * 10**scale)`` (``x / 10**-scale`` for a negative
    scale), the halfway point ``h = (10k + 5) / 10**(scale+1)``; ``r = k + (x >= h)``; the result
    ``±r / 10**scale``, +0.0 where ``r`` is 0, NaN and infinities themselves. Each step is one
    IEEE operation on doubles, in DuckDB as in pyarrow. Where ``x`` passes the formula's bound
    (``|x| * 10**(scale+1) < 2**52`` and ``|x| < 2**53``) it raises ``ArrowInvalid``: DuckDB (which
    raises there too) and then Spark decide. An int or a bigint to a scale >= 0 is itself."""
    scale = 0 if scale_node is None else _int_literal(scale_node)
    if scale is None or scale not in ROUND_SCALES or a.literal:
        raise _Refuse("round scale or operand")
    if a.typ in _INTEGERS and scale >= 0:
        return a
    if a.typ != DOUBLE:
        raise _Refuse(f"round of {a.typ}")
    if scale >= 0:
        unit, tenth = pa.scalar(10.0 ** scale), pa.scalar(10.0 ** (scale + 1))
    else:
        unit, tenth = pa.scalar(10.0 ** -scale), pa.scalar(10.0 ** (-scale - 1))
    bound = round_bound(scale)
    up, down = (pc.multiply, pc.divide) if scale >= 0 else (pc.divide, pc.multiply)

    def value(table: pa.Table) -> Any:
        v = a.value(table)
        x = pc.abs(v)
        finite = pc.is_finite(v)
        if pc.any(pc.and_kleene(finite, pc.greater_equal(x, bound))).as_py():
            raise pa.ArrowInvalid("round of a double this large: DuckDB or Spark decides")
        k = pc.floor(up(x, unit))
        half = down(pc.add(pc.multiply(k, 10.0), 5.0), tenth)
        r = pc.add(k, pc.cast(pc.greater_equal(x, half), pa.float64()))
        signed = pc.if_else(pc.less(v, 0.0), pc.negate(r), r)
        rounded = pc.if_else(pc.equal(r, 0.0), 0.0, down(signed, unit))
        return pc.if_else(finite, rounded, v)

    return _Operand(value, DOUBLE, False)


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
    if kinds <= _INTEGERS or (a.typ == b.typ and a.typ in _SELF_COMPARED):
        ieee = _IEEE[kind]
        return _Operand(lambda table: ieee(a.value(table), b.value(table)), BOOLEAN, literal)
    if DOUBLE in kinds and kinds <= {INT, BIGINT, DOUBLE, DECIMAL_LIT}:
        return _Operand(_doubles(kind, _as_double(a), _as_double(b)), BOOLEAN, literal)
    if _decimal_of(a.typ) is not None or _decimal_of(b.typ) is not None:
        return _decimal_comparison(kind, a, b)
    raise _Refuse(f"comparison {a.typ} vs {b.typ}")


def _decimal_comparison(kind: str, a: _Operand, b: _Operand) -> _Operand:
    """A comparison of two decimals of one scale (columns, CASE or COALESCE of them), or of a
    decimal and an integer or decimal literal of at most its scale's fractional digits (the
    literal written at that scale): Spark compares them in their common decimal type, exactly
    where it has at most 38 digits (checked: with an integer literal taken as wide as a
    bigint, whatever Spark's literal narrowing); pyarrow compares the unscaled integers of
    one scale, exactly. Anything else refuses (scales that differ, a double: see
    ``_compare``)."""
    da, db = _decimal_of(a.typ), _decimal_of(b.typ)
    if da is not None and db is not None:
        if da[1] != db[1]:
            raise _Refuse("decimals of different scales")
        wide = pa.decimal128(max(da[0], db[0]), da[1])
        x, y = a, b
    else:
        column, other = (a, b) if da is not None else (b, a)
        precision, scale = _decimal_of(column.typ) or (0, 0)
        if other.exact is None or other.typ not in (*_INTEGERS, DECIMAL_LIT):
            raise _Refuse(f"comparison {a.typ} vs {b.typ}")
        sign, digits, exponent = other.exact.as_tuple()
        assert isinstance(exponent, int)
        whole = max(len(digits) + exponent, 1)  # digits before the point, as Spark counts them
        if -exponent > scale or max(precision - scale, whole,
                                    20 if other.typ in _INTEGERS else 0) + scale > 38:
            raise _Refuse("decimal literal beyond the column's scale or 38 digits")
        wide = pa.decimal128(max(precision - scale, whole) + scale, scale)
        with localcontext(Context(prec=40)):  # exact: at most 38 digits
            number = other.exact.quantize(Decimal(1).scaleb(-scale))
        scalar = _Operand(lambda table: pa.scalar(number, wide), column.typ, True)
        x, y = (column, scalar) if column is a else (scalar, column)
    ieee = _IEEE[kind]
    return _Operand(lambda table: ieee(pc.cast(x.value(table), wide),
                                       pc.cast(y.value(table), wide)),
                    BOOLEAN, a.literal and b.literal)


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
