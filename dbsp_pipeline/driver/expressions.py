"""Spark SQL expressions as DuckDB SQL, translated only when the two agree exactly.

Users write ``select`` expressions and ``filter`` predicates in Spark SQL. On the driver, a small
change is evaluated by DuckDB over Arrow instead of by a Spark job, and it must give exactly what
Spark gives (Spark 4, ANSI mode, the engine's UTC session). This module is the gate:

* a translation (a ``str``) means: over any rows of the given input schema, DuckDB computes the
  same values as Spark (NULL where Spark gives NULL, NaN where Spark gives NaN), up to result
  *types* that cast to the Spark-analysed type without changing the value (e.g. ``BIGINT`` for
  ``int``), which the caller casts afterwards;
* ``None`` means: use Spark for this operator. It is always a correct answer, only a slower one,
  so every construct not on the whitelist below, or whose operand types are not on it, refuses.

How: the text is parsed with sqlglot (``read="spark"``), every node is checked against a
whitelist of node classes (exact classes, not subclasses) and of argument slots, with a small
type inference over the input schema, and DuckDB SQL is generated bottom-up with explicit
parentheses around every operand (identifiers quoted by ``sql.ident``, string literals rendered by
sqlglot's ``duckdb`` dialect, numbers re-rendered from their parsed values). Nothing of the input is
copied through unchecked. Before the walk, the token stream is checked for what sqlglot's tree
would hide or read differently from Spark: a unary ``+`` (sqlglot drops it) and two comparisons
or predicates in one operand without parentheses (``a = b < c`` is ``(a = b) < c`` in Spark,
``a = (b < c)`` in sqlglot); both refuse. The tokens also give what sqlglot's tree loses: the
pattern of ``date_format`` as written (sqlglot rewrites ``YYYY`` and ``yyyy`` alike) and whether
``unix_timestamp`` was given a format (sqlglot adds its default one).

Why not ``sqlglot.transpile(..., write="duckdb")`` for the output too: its DuckDB text says what
the Spark text means in most rows, not in all of them, and this gate needs all. Checked with the
pinned sqlglot: ``a / b`` becomes ``a / NULLIF(b, 0)`` (NULL where Spark ANSI raises),
``x + 1 > 5`` stays an infix sum (DuckDB's optimizer rewrites it and drops the overflow Spark
raises), ``CAST(d AS STRING)`` becomes ``TRY_CAST`` (NULL where Spark raises), ``s LIKE 'a_b'``,
``upper(s)`` and ``substring(s, 0, 2)`` pass through unchanged but count or case-map differently,
``DATE ... + INTERVAL 1 MONTH`` gives a TIMESTAMP, ``a = b < c`` and ``+a`` are re-associated or
dropped. So sqlglot is the one parser of all SQL text (views and expressions alike), and the
generation is ours: one function per whitelisted node, each checked against Spark.

Whitelist (each item verified against Spark 4.3 + DuckDB 2.0 by ``tests/driver/test_expressions``):

* column references (top-level columns of the input, case-insensitive like Spark's default
  resolution, backticks allowed), rendered as double-quoted DuckDB identifiers. Columns of type
  int, bigint, double, decimal, string (UTF8_BINARY), boolean, date, timestamp, timestamp_ntz
  take part in expressions; tinyint, smallint, float and binary columns only pass through
  unchanged (a bare column, possibly aliased) or under ``IS [NOT] NULL``; other types refuse;
* literals: integers in the bigint range (typed as Spark types them: int if it fits, a leading
  minus sign included, else bigint), decimals of at most 15 digits (of 16 to 18 digits when
  only compared with integers), exponent doubles (``1e3``; the ``Y``/``S``/``BD`` suffixes
  refuse; ``1L`` and ``1D`` read as casts of an int to BIGINT and DOUBLE), strings (no
  backslash anywhere in the text: Spark's escape rules are not sqlglot's; adjacent literals
  refuse), ``TRUE``, ``FALSE``, ``NULL``, and ``DATE 'yyyy-mm-dd'`` (or
  ``date('yyyy-mm-dd')``, ``CAST('yyyy-mm-dd' AS DATE)``) for a valid date;
* constants folded here as Spark computes them (``_folded_constant``): a date literal plus or
  minus ``INTERVAL 'n' DAY|MONTH|YEAR`` (month arithmetic clamps to the month's last day, as
  Spark's ``add_months``; DuckDB would give a TIMESTAMP), and decimal literals joined by
  ``+ - *`` (exact in Spark: ``0.06 - 0.01`` is ``0.05``), typed as a decimal literal;
* ``+ - *`` and unary minus on int/bigint/double (a decimal literal with a double; beside an
  int or a bigint it is decimal arithmetic, below; never ``% div``);
* decimals (``_decimal_arithmetic``, ``_decimal_division``, ``_decimal_comparison``,
  ``_decimal_branches``): ``+ - * /`` of a decimal with a decimal, an int, a bigint or a decimal or
  integer literal, and of an int or a bigint with a decimal literal (``minutes / 60.0``: Spark's
  decimals, not doubles), of Spark's result type (its precision rules, a type past 38 digits
  adjusted to fewer fractional digits) and value: the exact result, rounded half up to that type's
  scale (where Spark rounds; a quotient always), raising where it does not fit the type, as Spark's
  ANSI mode does, and on a zero divisor; computed by DuckDB exactly (operands cast to 38 digits; a
  quotient in 128-bit integers) and cast to Spark's type, which rounds half away from zero as Spark
  does. Where an exact intermediate passes 38 digits, or an operand of ``+ -`` does not fit 38
  digits of the other's scale (only where Spark rounds), DuckDB raises and Spark does not (see
  "Errors"). Unary minus and ``abs`` (the same type, up to 34 digits); comparisons and ``BETWEEN``
  with a decimal, integer or decimal literal, exact in both once cast to their common type within 38
  digits; CASE branches and COALESCE arguments of decimals, ints, bigints, literals and NULL, cast
  to Spark's common type (an integer literal there counts as an int: ``DECIMAL(10,0)``). Each result
  with a decimal column in it is typed as Spark types it (checked against Spark's schema). A decimal
  of at most 15 digits beside a double in ``+ - *`` or a comparison, or cast to DOUBLE, is the
  double Spark makes of it (its unscaled value divided by a power of ten, both exact doubles: the
  correctly rounded double, which DuckDB's conversion is too). Refused: unary minus and ``abs`` of
  more than 34 digits (Spark rounds them to 34 significant digits), a decimal of more than 15 digits
  beside a double (Spark rounds its unscaled value to a double first) or a bare NULL, ``%`` and
  ``div`` of decimals, common types past 38 digits, ``IN`` lists and ``CASE x WHEN`` of decimals, a
  decimal and a double in ``BETWEEN``;
* ``/`` of int/bigint/double (a decimal literal with a double): Spark divides as doubles;
  on a zero divisor Spark (ANSI) raises where DuckDB gives NULL, so the translation raises
  (``error()``) on every zero divisor and the caller lets Spark decide.
  Integer arithmetic is generated as ``add``/``subtract``/``multiply`` calls, which DuckDB types
  and overflow-checks like ``+ - *`` (int op int is int, raising on overflow, as Spark ANSI does)
  but which its optimizer does not rewrite: it turns ``x + 1 > 5`` into ``x > 4`` and ``-x > 5``
  into ``x < -5``, which would drop the overflow error Spark raises for ``x = 2147483647``;
* comparisons ``= == <> != < <= > >= <=>`` and ``IS [NOT] DISTINCT FROM`` within one type family:
  numbers with numbers (Spark and DuckDB compare int with double as doubles and int with decimal
  exactly, NaN equal to NaN and above +inf in both), string with string (bytewise in both),
  boolean, date, timestamp, timestamp_ntz each with itself; NULL with anything. Never a string
  with a number or a date (the two engines coerce those differently);
* ``AND OR NOT`` (three-valued), ``IS [NOT] NULL``, ``x [NOT] IN (literals...)``,
  ``x [NOT] BETWEEN a AND b``, ``CASE [x] WHEN ... THEN ... [ELSE ...] END`` (conditions
  boolean: Spark rejects ``WHEN NULL``), ``COALESCE`` (and its spellings ``nvl``/``ifnull``),
  whose branches unify as Spark's do (int+bigint is bigint, int+double is double, NULL takes the
  other type; anything else refuses);
* ``length(string)`` (code points in both; cast back to int as Spark types it), ``abs`` of
  int/bigint/double (raising on the minimum integer in both), ``substring(s, start, length)``
  with integer literals ``start >= 1`` and ``length >= 0`` (code points in both; other starts
  count differently), ``EXTRACT(YEAR|MONTH|DAY FROM d)`` and ``year/month/day(d)`` of a DATE
  (an int, as Spark types it);
* dates and timestamps (a TIMESTAMP read in UTC, the engine's Spark session time zone,
  whatever DuckDB's own is: ``timezone('UTC', ts)``): ``year month day dayofmonth quarter
  dayofyear weekofyear dayofweek`` (Spark counts Sunday as 1) of a date or a timestamp,
  ``hour minute second`` of a timestamp, and ``EXTRACT`` of those but SECOND (Spark's is a
  decimal with the fraction), each an int, in each of Spark's spellings (``Y YEARS YR YRS``,
  ``QTR``, ``MON MONS MONTHS``, ``WEEK W WEEKS`` the ISO week, ``D DAYS``, ``DAYOFWEEK DOW``
  from Sunday as 1, ``DAYOFWEEK_ISO DOW_ISO`` from Monday as 1, ``DOY``, ``YEAROFWEEK`` the
  ISO week-based year, ``H HOURS HR HRS``, ``M MIN MINS MINUTES``: ``M`` is the minute);
  ``to_date(x)`` (no format), ``date(x)`` and ``CAST(x AS DATE)`` of a date or a timestamp;
  ``date_trunc(unit, x)`` of a date or a TIMESTAMP with a literal unit Spark knows (YEAR/YYYY/YY,
  QUARTER, MONTH/MM/MON, WEEK, DAY/DD, HOUR, MINUTE, SECOND, MILLISECOND, MICROSECOND), a TIMESTAMP;
  ``trunc(d, fmt)`` (YEAR to WEEK), a DATE; ``date_add``/``date_sub`` of a date (or a timestamp's
  date) and an int; ``datediff(end, start)``, an int;
* ``timestampdiff(unit, start, end)`` and ``datediff``/``date_diff(unit, start, end)`` of
  dates, timestamps and timestamps_ntz (``_timestamp_diff``), a BIGINT, for the units
  ``MICROSECOND MILLISECOND SECOND MINUTE HOUR DAY WEEK`` (the difference cut toward zero) and
  ``MONTH QUARTER YEAR`` (Java's ``LocalDateTime.until``: a month counts once the day of the
  month and the time of day are reached, January 31 to February 29 is 0; cut toward zero);
  the unit a bare word, as Spark's grammar wants (a quoted one refuses);
* ``add_months(d, n)`` of a date (or a timestamp's date) and an int, a DATE clamped to the
  month's last day (``_add_months``; past DuckDB's timestamps, about 290000 years, DuckDB
  raises: Spark decides); ``make_date(y, m, d)`` of ints (an invalid date raises in both);
* ``date_format(x, 'pattern')`` of a date, a timestamp or a timestamp_ntz (``_date_format``),
  the pattern a literal read from the text as written, one pattern per text, of the letters
  ``y yy yyyy M MM MMM MMMM d dd H HH m mm s ss``, ``S`` to ``SSSSSS`` (the fraction cut),
  ``E EE EEE EEEE`` (English names, Spark's locale), the separators `` -/:.,_`` and quoted
  text (``'T'``, ``''``); built of the parts of the UTC wall clock. A year outside 1 to 9999
  (Spark writes ``+10000``) raises (``error()``): Spark decides. Other letters refuse
  (``YYYY``, the week-based year; ``yyy``, ``hh``, ``a``, ``LLL``, ...);
* epoch numbers, a BIGINT (``_unix_time``): ``unix_seconds``, ``unix_millis``, ``unix_micros``
  of a timestamp or a timestamp_ntz and ``CAST(ts AS BIGINT)`` of a timestamp round down
  (1969-12-31 23:59:59.5 is -1), ``unix_timestamp(x)`` of those cuts toward zero (the same
  instant is 0, as Spark's) and of a date is its midnight in UTC. Refused: ``unix_timestamp()``
  and with a format, ``to_unix_timestamp``, a CAST to INT. A timestamp DuckDB reads as an
  infinity (Spark's largest) raises: Spark decides;
* strings: ``concat(...)`` and ``||`` of strings (NULL if any is; DuckDB's ``concat`` skips
  NULLs, so ``||``), ``trim``/``ltrim``/``rtrim`` (spaces, U+0020, only, as Spark's),
  ``replace(s, search[, replacement])``, ``startswith``/``endswith``/``contains``;
  ``lpad``/``rpad(s, n[, pad])`` with an integer literal ``n`` up to 10**6 and a literal pad
  (code points in both; ``n <= 0`` gives '', a longer string is cut to ``n``, an empty pad
  leaves a shorter one as it is, where DuckDB would raise: ``substring`` then);
  ``concat_ws(sep, s, ...)`` of strings and NULLs (NULLs skipped, NULL for a NULL separator,
  '' for no strings); ``left``/``right(s, n)`` with an integer literal (code points; ``n <= 0``
  gives '', where DuckDB drops code points from the other end);
  ``upper``/``lower`` where every character is ASCII: Spark uses Java's full case mapping
  (``upper('ß')`` is ``'SS'``, ``lower('İ')`` two code points), DuckDB maps code point by code
  point, so the translation raises (``error()``) on a string with another character and Spark
  decides that step (as on a zero divisor, below);
* comparisons of a TIMESTAMP with a DATE (its midnight in UTC), with ``TIMESTAMP '...'`` and
  with a string literal, and of a DATE with a string literal, as Spark's ANSI coercion reads
  them: only ``yyyy-mm-dd[ hh:mm[:ss[.ffffff]]]`` texts (a date's ``yyyy-mm-dd``), written
  as DuckDB's TIMESTAMPTZ with the UTC offset (Spark reads them in the session time zone);
* ``nullif(a, b)`` (not of decimals), ``last_day`` of a date (or a timestamp's date),
  ``greatest``/``least`` of ints, bigints, doubles, strings or dates (NULLs skipped in both;
  the first of equal values kept, -0.0 equal to 0.0, NaN above every number, in both);
* ``sqrt(x)`` and ``sign``/``signum(x)`` of an int, a bigint, a double or a decimal of at most
  15 digits, a DOUBLE (``_sqrt_sign``: IEEE's square root in both, NaN for a negative number,
  written out; Java's ``signum``, -0.0 and NaN themselves); ``initcap(s)`` of ASCII strings
  (``_initcap``: upper case after a space only; another character raises, Spark decides);
  ``split(s, 'sep')[i]`` and ``element_at(split(s, 'sep'), i)`` with a separator of no
  regular-expression syntax and an integer literal index (``_split_part``: an index past the
  pieces raises in both);
* ``if(c, a, b)`` as ``CASE WHEN c THEN a ELSE b END``; ``%`` of ints and bigints (the sign of
  the dividend in both; a zero divisor and the smallest integer by -1, where Spark ANSI raises
  or gives 0, raise in DuckDB: Spark decides); ``floor``/``ceil`` of an integer or a double, a
  BIGINT (NaN, which Spark takes to 0, and infinities and doubles past BIGINT, where Spark
  raises too, raise in DuckDB's cast: Spark decides); ``round``/``bround`` to a literal scale
  of an int, a bigint, a double (Spark rounds ``Double.toString``'s decimal text, not the binary
  value: see ``_rounded``; a double too large for its scale raises, Spark decides) or a decimal
  (``round`` only); ``CAST`` to DATE (above), to STRING of an integer or a string, to INT,
  BIGINT or DOUBLE of an integer (an INT out of range raises in both). Not a double to an
  integer (DuckDB rounds, Spark truncates), a string to a number or a date or a double to a
  string (they parse and print differently);
* ``s [NOT] LIKE 'pattern'`` of a string with a literal pattern without ``_`` (Spark matches
  ``_`` to one UTF-16 unit, DuckDB to one code point) and without a backslash (refused
  everywhere): ``%`` matches any run of characters, newlines included, in both;
* ``expr AS name`` (and ``expr name``) in projections; the output is aliased to the given name.

Dropped from the first plan, because the engines differ: ``upper``/``lower`` beyond ASCII (see
above), ``exp``, ``ln``/``log``, ``log10``, ``pow``/``power`` and ``cbrt`` (Java's ``StrictMath``
and DuckDB's C library differ in the last bit on some values: ``exp(1.0)`` is
2.7182818284590455 in Spark, 2.718281828459045 in DuckDB), ``%`` of doubles and decimals,
``div``, string/number comparisons, timestamp literals in other texts than the above (Spark reads
several forms), arithmetic on tinyint/smallint/float columns (DuckDB keeps ``tinyint + 1`` a TINYINT
that overflows at 127, Spark widens to int).

Errors. Where Spark raises (integer overflow in an evaluated operation), DuckDB raises too on
the same operation (checked in the tests, including the forms DuckDB's optimizer would otherwise
rewrite). The converse is not guaranteed: Spark skips some sub-expressions (the right side of
``AND``/``OR`` once decided, the other operand of an arithmetic operator once one is NULL) that
DuckDB may still evaluate, so on data where such a skipped sub-expression would overflow,
DuckDB raises where Spark returns a value; so does a decimal result Spark rounds whose exact
value needs more than 38 digits (or a quotient's 128 bits). A caller that must never fail
where Spark would not should treat a DuckDB error from a translated expression as "use Spark
for this step" (the Spark run then either raises the genuine error or returns Spark's values).
"""

from __future__ import annotations

import calendar
import datetime
import math
import re
from collections.abc import Sequence
from decimal import Context, Decimal, localcontext
from fractions import Fraction
from typing import Any, TypeAlias, cast

import sqlglot
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokenizer_core import Token, TokenType

from dbsp_pipeline.driver import spark_decimal
from dbsp_pipeline.driver.sql import ident

#: lower-cased column name -> (exact name, type tag; None: a type expressions cannot use)
Columns: TypeAlias = dict[str, tuple[str, str | None]]

__all__ = ["translate_predicate", "translate_projection"]

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_SPARK = Dialect.get_or_raise("spark")  # sqlglot's Spark dialect (its rewriting of patterns)

# Types of the little inference. Expression types: the first group. A bare column of a
# pass-through type is typed "other" and may only be projected as is or tested for NULL.
INT, BIGINT, DOUBLE = "int", "bigint", "double"
# Decimal literals: up to 15 digits (converted to a double alike by both engines), and up to 18
# digits (compared exactly with integers by both, but never mixed with doubles).
DECIMAL_LIT, DECIMAL_WIDE = "decimal_literal", "wide_decimal_literal"
STRING, BOOLEAN, DATE, TIMESTAMP, TIMESTAMP_NTZ = (
    "string", "boolean", "date", "timestamp", "timestamp_ntz")
NULL, OTHER = "null", "other"

_NUMERIC = {INT, BIGINT, DOUBLE, DECIMAL_LIT, DECIMAL_WIDE}
_ARITH = {INT, BIGINT, DOUBLE}
_DUCKDB_ARITH: dict[type[exp.Expression], str] = {exp.Add: "add", exp.Sub: "subtract",
                                                  exp.Mul: "multiply"}
_COMPARISONS: dict[type[exp.Expression], str] = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<",
                exp.LTE: "<=", exp.GT: ">",
                exp.GTE: ">=", exp.NullSafeEQ: "IS NOT DISTINCT FROM",
                exp.NullSafeNEQ: "IS DISTINCT FROM"}


#: EXTRACT fields, Spark's spellings of each (``DatePart.parseExtractField``), and the DuckDB
#: function of each (Spark returns an int; its EXTRACT(SECOND) is a decimal with the fraction,
#: not translated). ``M`` is the minute to Spark. ``dayofweek`` counts Sunday as 1 (see
#: ``_date_part``), ``isodow`` Monday as 1, ``isoyear`` is the ISO week-based year
_EXTRACT_PARTS = {
    **dict.fromkeys(("YEAR", "Y", "YEARS", "YR", "YRS"), "year"),
    "YEAROFWEEK": "isoyear", "QUARTER": "quarter", "QTR": "quarter",
    **dict.fromkeys(("MONTH", "MON", "MONS", "MONTHS"), "month"),
    **dict.fromkeys(("WEEK", "W", "WEEKS"), "weekofyear"),
    **dict.fromkeys(("DAY", "D", "DAYS"), "day"),
    **dict.fromkeys(("DAYOFWEEK", "DOW"), "dayofweek"),
    **dict.fromkeys(("DAYOFWEEK_ISO", "DOW_ISO"), "isodow"), "DOY": "dayofyear",
    **dict.fromkeys(("HOUR", "H", "HOURS", "HR", "HRS"), "hour"),
    **dict.fromkeys(("MINUTE", "M", "MIN", "MINS", "MINUTES"), "minute")}
#: Spark's functions of a date's or a timestamp's parts, and DuckDB's function of each
_DATE_PART_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.DayOfMonth: "day",
    exp.Quarter: "quarter", exp.DayOfYear: "dayofyear", exp.WeekOfYear: "weekofyear",
    exp.DayOfWeek: "dayofweek", exp.Hour: "hour", exp.Minute: "minute", exp.Second: "second"}
#: the parts of a time of day: of a timestamp only (Spark reads a date as its midnight there)
_TIME_PARTS = {"hour", "minute", "second"}


class _Refuse(Exception):
    """Raised anywhere in the walk: the expression is not translated."""


def translate_projection(exprs: Sequence[str], input_schema: StructType,
                         output_names: Sequence[str]) -> str | None:
    """A DuckDB select list equal to Spark's ``df.select(*[F.expr(e) for e in exprs])``, or None.

    ``df`` has ``input_schema``'s columns; ``output_names`` are the Spark-analysed output column
    names, one per expression. The result is ``<sql> AS "<name>", ...``, one item per expression
    in order, to be used as ``SELECT <result> FROM <table of input_schema's columns>``. It gives
    the same values as Spark on every row (result types may be wider, e.g. BIGINT for int, and
    are meant to be cast to Spark's output schema afterwards). None when any expression is not
    on the module's whitelist: the caller then evaluates the projection with Spark.
    """
    if len(exprs) != len(output_names) or not exprs:
        return None
    columns = _columns(input_schema)
    if columns is None:
        return None
    items = []
    try:  # any failure of the walk, expected (_Refuse) or not, means "let Spark do it"
        for text, name in zip(exprs, output_names):
            node = _parse(text)
            if type(node) is exp.Alias:
                if set(k for k, v in node.args.items() if v) - {"this", "alias"}:
                    raise _Refuse("alias form")
                node = node.this
            sql, typ = _bare_column(node, columns) or _translate(node, columns)
            if typ == NULL:
                raise _Refuse("untyped NULL result")
            items.append(f"{sql} AS {ident(name)}")
    except Exception:  # _Refuse, RecursionError on absurdly deep input, anything unforeseen
        return None
    return ", ".join(items)


def translate_predicate(predicate: str, input_schema: StructType) -> str | None:
    """A DuckDB boolean expression equal to Spark's ``F.expr(predicate)``, or None.

    Evaluated over a table with ``input_schema``'s columns, it is TRUE, FALSE or NULL exactly
    where Spark's predicate is (so ``WHERE coalesce((<result>), FALSE)`` keeps Spark's rows).
    None when the predicate is not on the module's whitelist or is not boolean: the caller then
    evaluates the filter with Spark.
    """
    columns = _columns(input_schema)
    if columns is None:
        return None
    try:
        sql, typ = _translate(_parse(predicate), columns)
    except Exception:  # _Refuse, RecursionError on absurdly deep input, anything unforeseen
        return None
    return sql if typ == BOOLEAN else None


# --- parsing and schema ------------------------------------------------------------------------

def _parse(text: str) -> exp.Expression:
    """One Spark SQL expression as a sqlglot tree, refusing what sqlglot would silently change."""
    if not isinstance(text, str) or "\\" in text:
        # Spark's string-literal escapes (\%, \_, \uXXXX, octal, ...) are not sqlglot's.
        raise _Refuse("backslash")
    try:
        trees = sqlglot.parse(text, read="spark")
        tokens = sqlglot.tokenize(text, read="spark")
    except Exception as e:  # sqlglot raises ParseError, TokenError, and sometimes others
        raise _Refuse(f"parse: {e}") from None
    if len(trees) != 1 or trees[0] is None:
        raise _Refuse("not one expression")
    tree: exp.Expression = cast(exp.Expression, trees[0])
    # sqlglot drops a unary plus (``+s`` parses as ``s``); Spark's unary plus is a typed function
    # (it rejects or casts some types), so every '+' must be a binary addition.
    pluses = sum(1 for t in tokens if t.token_type == TokenType.PLUS)
    if pluses != sum(1 for _ in tree.find_all(exp.Add)):
        raise _Refuse("unary plus")
    _check_one_comparison_per_operand(tokens)
    _mark_calls_from_tokens(tree, tokens, text)
    return tree


#: where ``_mark_calls_from_tokens`` leaves what sqlglot's tree does not say (``Expression.meta``)
_PATTERN, _ONE_ARGUMENT = "spark_datetime_pattern", "spark_one_argument"
_BARE_UNIT = "spark_bare_unit"


def _calls(tokens: Sequence[Token], name: str) -> list[list[list[Token]]]:
    """Each call of the function ``name`` (any case, backticks allowed) in the token stream, in
    order: its arguments, each the list of its tokens (split at the call's own commas)."""
    calls = []
    for k, tok in enumerate(tokens[:-1]):
        if tok.token_type not in (TokenType.VAR, TokenType.IDENTIFIER) \
                or tok.text.lower() != name or tokens[k + 1].token_type != TokenType.L_PAREN:
            continue
        args: list[list[Token]] = [[]]
        depth = 0
        for t in tokens[k + 1:]:
            if t.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET):
                depth += 1
                if depth == 1:
                    continue
            elif t.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET):
                depth -= 1
                if depth == 0:
                    break
            elif t.token_type == TokenType.COMMA and depth == 1:
                args.append([])
                continue
            args[-1].append(t)
        calls.append(args if args != [[]] else [])
    return calls


def _mark_calls_from_tokens(tree: exp.Expression, tokens: Sequence[Token], text: str) -> None:
    """Note on sqlglot's nodes what only the text says, or leave them unmarked (then refused)."""
    _mark_date_formats(tree, tokens, text)
    _mark_unix_timestamps(tree, tokens)
    _mark_diff_units(tree, tokens)


def _mark_date_formats(tree: exp.Expression, tokens: Sequence[Token], text: str) -> None:
    """Mark each ``date_format`` node with the user's own pattern, where it is certain.

    sqlglot rewrites the pattern into its own strftime-like text, which loses letters Spark
    tells apart (``yyyy`` and ``YYYY``, the week-based year, both become ``%Y``). So the pattern
    is read from the token stream: each ``date_format`` call's second argument must be one
    string literal, quoted alike at both ends with no quote of that kind inside (adjacent
    literals, ``'a''b'``, are two tokens), all the calls of the text must have the same
    pattern, as many as sqlglot's ``TimeToStr`` nodes, and sqlglot's rewriting of that pattern
    must be each node's format; then every node is marked with it."""
    nodes = [n for n in tree.find_all(exp.TimeToStr) if type(n) is exp.TimeToStr]
    if not nodes:
        return
    calls = _calls(tokens, "date_format")
    patterns = set()
    for args in calls:
        literal = args[1] if len(args) == 2 and len(args[1]) == 1 else None
        raw = "" if literal is None or literal[0].token_type != TokenType.STRING \
            else text[literal[0].start:literal[0].end + 1]
        if len(raw) < 2 or raw[0] not in "'\"" or raw[-1] != raw[0] or raw[0] in raw[1:-1]:
            return
        patterns.add(raw[1:-1])
    if len(calls) != len(nodes) or len(patterns) != 1:
        return
    pattern = patterns.pop()
    if any(n.args.get("format") != _SPARK.format_time(exp.Literal.string(pattern))
           for n in nodes):
        return
    for n in nodes:
        n.meta[_PATTERN] = pattern


def _mark_unix_timestamps(tree: exp.Expression, tokens: Sequence[Token]) -> None:
    """Mark the ``unix_timestamp(x)`` nodes of one argument. sqlglot adds its default format
    where none is written, so ``unix_timestamp(x, fmt)`` cannot be told from it in the tree:
    the nodes are marked when every ``unix_timestamp`` call of the text has exactly one
    argument and the calls are as many as the nodes (``to_unix_timestamp`` is a node too)."""
    nodes = [n for n in tree.find_all(exp.StrToUnix) if type(n) is exp.StrToUnix]
    calls = _calls(tokens, "unix_timestamp")
    if nodes and len(calls) == len(nodes) and all(len(args) == 1 for args in calls):
        for n in nodes:
            n.meta[_ONE_ARGUMENT] = True


def _mark_diff_units(tree: exp.Expression, tokens: Sequence[Token]) -> None:
    """Mark the ``timestampdiff``/``datediff``/``date_diff(unit, start, end)`` nodes whose unit
    is written as a bare word, as Spark's grammar wants it: sqlglot reads a quoted ``'HOUR'``
    (which Spark rejects) as the same unit. Marked when every three-argument call of those
    names has a unit of one word token and the calls are as many as the nodes."""
    nodes = [n for n in tree.find_all(exp.TimestampDiff, exp.DateDiff)
             if type(n) is exp.TimestampDiff or (type(n) is exp.DateDiff
                                                 and n.args.get("unit") is not None)]
    calls = [args for name in ("timestampdiff", "datediff", "date_diff")
             for args in _calls(tokens, name) if len(args) == 3]
    if nodes and len(calls) == len(nodes) and all(
            len(args[0]) == 1 and args[0][0].token_type == TokenType.VAR for args in calls):
        for n in nodes:
            n.meta[_BARE_UNIT] = True


_COMPARE_TOKENS = {TokenType.EQ, TokenType.NEQ, TokenType.LT, TokenType.LTE, TokenType.GT,
                   TokenType.GTE, TokenType.NULLSAFE_EQ, TokenType.IS, TokenType.IN,
                   TokenType.BETWEEN, TokenType.LIKE, TokenType.ILIKE, TokenType.RLIKE}
_SEGMENT_BREAKS = {TokenType.AND, TokenType.OR, TokenType.COMMA, TokenType.WHEN,
                   TokenType.THEN, TokenType.ELSE}
_OPENERS = {TokenType.L_PAREN: TokenType.R_PAREN, TokenType.CASE: TokenType.END}


def _check_one_comparison_per_operand(tokens: Sequence[Token]) -> None:
    """Refuse two comparisons/predicates in one operand of AND/OR/NOT unless parenthesized.

    Spark puts every comparison operator on one left-associative level, with IS NULL, IN,
    BETWEEN, IS DISTINCT FROM taking a whole comparison chain as subject (``a = b < c`` is
    ``(a = b) < c``, ``a = b IS NULL`` is ``(a = b) IS NULL``, ``x BETWEEN 1 AND 2 = b`` is
    ``x BETWEEN 1 AND (2 = b)``); sqlglot ranks ``<`` above ``=`` and binds predicates its own
    way. The user's parentheses cannot be read back from sqlglot's tree (its parser adds Paren
    nodes of its own), so this looks at the tokens: between two of ``AND OR NOT , ( ) CASE WHEN
    THEN ELSE END`` at one nesting depth, at most one comparison operator or predicate keyword.
    With one, sqlglot's tree and Spark's agree (arithmetic precedence is the same in both).
    """
    stack: list[list[Any]] = [[0, False, None]]  # per depth: [count, inside BETWEEN, closing token]
    prev = None
    for tok in tokens:
        tt = tok.token_type
        frame = stack[-1]
        if tt in _OPENERS:
            stack.append([0, False, _OPENERS[tt]])
        elif len(stack) > 1 and tt == frame[2]:
            stack.pop()
        elif tt in (TokenType.R_PAREN, TokenType.END):
            raise _Refuse("unbalanced")
        elif tt == TokenType.AND and frame[1]:
            frame[1] = False  # the AND of BETWEEN ... AND ...: the same operand goes on
        elif tt in _SEGMENT_BREAKS or (tt == TokenType.NOT and (
                prev is None or prev in _SEGMENT_BREAKS or prev in _OPENERS
                or prev == TokenType.NOT)):
            frame[0], frame[1] = 0, False  # a new boolean operand starts
        elif tt in _COMPARE_TOKENS:
            frame[0] += 1
            frame[1] = tt == TokenType.BETWEEN
            if frame[0] > 1:
                raise _Refuse("comparison chain without parentheses")
        prev = tt


def _columns(schema: StructType) -> Columns | None:
    """Lower-cased column name -> (exact name, type tag); None if names clash case-insensitively."""
    if not isinstance(schema, StructType):
        return None
    out: Columns = {}
    for field in schema.fields:
        key = field.name.lower()
        if key in out:
            return None  # ambiguous for Spark's case-insensitive resolution: let Spark decide
        out[key] = (field.name, _type_tag(field.dataType))
    return out


def _type_tag(dt: DataType) -> str | None:
    t = type(dt)
    if t is IntegerType:
        return INT
    if t is LongType:
        return BIGINT
    if t is DoubleType:
        return DOUBLE
    if t is StringType and getattr(dt, "collation", "UTF8_BINARY") == "UTF8_BINARY":
        return STRING
    if t is BooleanType:
        return BOOLEAN
    if t is DateType:
        return DATE
    if t is TimestampType:
        return TIMESTAMP
    if t is TimestampNTZType:
        return TIMESTAMP_NTZ
    if t is DecimalType:
        return _decimal_tag(cast(DecimalType, dt).precision, cast(DecimalType, dt).scale)
    if t in (ByteType, ShortType, FloatType, BinaryType):
        return OTHER
    return None  # complex, collated strings, intervals, variant, ...: refuse any reference


# --- the walk ----------------------------------------------------------------------------------

def _only(node: exp.Expression, *allowed: str) -> None:
    """Refuse a node that uses an argument slot outside ``allowed`` (a variant we did not check)."""
    for key, value in node.args.items():
        if key not in allowed and value not in (None, False, [], ""):
            raise _Refuse(f"{type(node).__name__}.{key}")


def _unparen(node: exp.Expression) -> exp.Expression:
    while type(node) is exp.Paren:
        _only(node, "this")
        node = node.this
    return node


def _bare_column(node: exp.Expression, columns: Columns) -> tuple[str, str] | None:
    """A bare column reference of any supported type (pass-through types included), or None."""
    node = _unparen(node)
    if type(node) is exp.Column:
        return _column(node, columns)
    return None


def _column(node: exp.Column, columns: Columns) -> tuple[str, str]:
    name, typ = _column_name(node, columns)
    return ident(name), typ


def _column_name(node: exp.Column, columns: Columns) -> tuple[str, str]:
    """The exact name and type tag of a column reference (case-insensitive, as Spark's)."""
    _only(node, "this")
    name = node.this
    if type(name) is not exp.Identifier:
        raise _Refuse("column form")  # e.g. a star
    _only(name, "this", "quoted")
    hit = columns.get(name.name.lower())
    if hit is None or hit[1] is None:
        raise _Refuse(f"unknown or unsupported column {name.name!r}")
    return hit[0], hit[1]


def _translate(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """(DuckDB SQL, type tag) of a whitelisted expression; raises _Refuse otherwise.

    Pass-through ("other") columns come back typed OTHER; every caller but IS NULL refuses them.
    """
    t: type[exp.Expression] = type(node)
    if t is exp.Paren:
        return _translate(_unparen(node), columns)
    if t is exp.Column:
        return _column(cast(exp.Column, node), columns)
    if t in (exp.Literal, exp.Boolean, exp.Null) or (t is exp.Neg and _is_number(node.this)):
        return _literal(node)
    if t in (exp.Cast, exp.TryCast):
        return _cast_to(node, columns)
    folded = _folded_constant(node)
    if folded is not None:
        return folded
    if t is exp.Neg:
        _only(node, "this")
        sql, typ = _translate(node.this, columns)
        if _decimal_of(typ) is not None:
            _exactly_negated(typ)
            return f"(-{sql})", typ  # the same type in both
        if typ not in _ARITH:
            raise _Refuse(f"operand type {typ}")
        if typ == DOUBLE:
            return f"(-{sql})", DOUBLE  # keeps -0.0, as Spark's unary minus does
        return f"subtract(0, {sql})", typ  # integral: overflow-checked, not rewritten by DuckDB
    if t in _DUCKDB_ARITH:
        _only(node, "this", "expression")
        return _arithmetic(_DUCKDB_ARITH[t], node.this, node.expression, columns)
    if t is exp.Div:
        _only(node, "this", "expression", "typed", "safe")
        if node.args.get("typed"):
            raise _Refuse("typed division")
        return _division(node.this, node.expression, columns)
    if t is exp.Like:
        return _like(cast(exp.Like, node), columns)
    if t is exp.Extract:
        _only(node, "this", "expression")
        unit = node.this
        part = _EXTRACT_PARTS.get(unit.name.upper()) if type(unit) is exp.Var else None
        if part is None:
            raise _Refuse("EXTRACT unit")
        return _date_part(part, node.expression, columns)
    if t in _DATE_PART_FUNCTIONS:
        _only(node, "this")
        arg = node.this
        if type(arg) is exp.TsOrDsToDate:  # sqlglot's reading of year(x): x as a date
            _only(arg, "this")
            arg = arg.this
        return _date_part(_DATE_PART_FUNCTIONS[t], arg, columns)
    if t is exp.Substring:
        _only(node, "this", "start", "length")
        a, _ = _typed(node.this, columns, {STRING})
        start, length = _int_literal(node.args.get("start")), _int_literal(node.args.get("length"))
        if start is None or not 1 <= start <= _INT_MAX or length is None \
                or not 0 <= length <= _INT_MAX:
            raise _Refuse("substring positions")  # 0 and negative starts differ between them
        return f"substring({a}, {start}, {length})", STRING
    if t in _COMPARISONS:
        _only(node, "this", "expression")
        _no_bare_predicate(node.this, node.expression)
        a, ta = _translate(node.this, columns)
        b, tb = _translate(node.expression, columns)
        if DOUBLE in (ta, tb):  # Spark compares a decimal with a double as doubles
            a, ta = _decimal_as_double(a, ta)
            b, tb = _decimal_as_double(b, tb)
        if _decimal_of(ta) is not None or _decimal_of(tb) is not None:
            return _decimal_comparison(_COMPARISONS[t], (node.this, a, ta),
                                       (node.expression, b, tb)), BOOLEAN
        a, ta = _coerced(tb, node.this, a, ta)
        b, tb = _coerced(ta, node.expression, b, tb)
        _comparable(ta, tb)
        return f"({a} {_COMPARISONS[t]} {b})", BOOLEAN
    if t in (exp.And, exp.Or):
        _only(node, "this", "expression")
        a, _ = _typed(node.this, columns, {BOOLEAN, NULL})
        b, _ = _typed(node.expression, columns, {BOOLEAN, NULL})
        return f"({a} {'AND' if t is exp.And else 'OR'} {b})", BOOLEAN
    if t is exp.Not:
        _only(node, "this")
        a, _ = _typed(node.this, columns, {BOOLEAN, NULL})
        return f"(NOT {a})", BOOLEAN
    if t is exp.Is:
        _only(node, "this", "expression")
        if type(node.expression) is not exp.Null:
            raise _Refuse("IS TRUE / IS FALSE / IS <expr>")
        _no_bare_predicate(node.this)
        a, _ = _translate(node.this, columns)  # any type, pass-through columns included
        return f"({a} IS NULL)", BOOLEAN
    if t is exp.In:
        return _in(cast(exp.In, node), columns)
    if t is exp.Between:
        _only(node, "this", "low", "high")
        _no_bare_predicate(node.this, node.args["low"], node.args["high"])
        x, tx = _translate(node.this, columns)
        lo, tlo = _translate(node.args["low"], columns)
        hi, thi = _translate(node.args["high"], columns)
        if any(_decimal_of(typ) is not None for typ in (tx, tlo, thi)):
            # Spark's BETWEEN is ``x >= low AND x <= high``, each comparison typed apart
            subject = (node.this, x, tx)
            return (f"({_decimal_comparison('>=', subject, (node.args['low'], lo, tlo))} AND "
                    f"{_decimal_comparison('<=', subject, (node.args['high'], hi, thi))})",
                    BOOLEAN)
        lo, tlo = _coerced(tx, node.args["low"], lo, tlo)
        hi, thi = _coerced(tx, node.args["high"], hi, thi)
        _comparable(tx, tlo)
        _comparable(tx, thi)
        _comparable(tlo, thi)
        return f"({x} BETWEEN {lo} AND {hi})", BOOLEAN
    if t is exp.Case:
        return _case(cast(exp.Case, node), columns)
    if t is exp.Coalesce:
        _only(node, "this", "expressions", "is_nvl", "is_null")
        args = [node.this, *node.expressions]
        parts = [_translate(a, columns) for a in args]
        if any(_decimal_of(p[1]) is not None for p in parts):
            sqls, typ = _decimal_branches([(a, *p) for a, p in zip(args, parts)])
            return f"COALESCE({', '.join(sqls)})", typ
        typ = _unify([p[1] for p in parts])
        return f"COALESCE({', '.join(p[0] for p in parts)})", typ
    if t is exp.Length:
        _only(node, "this")
        a, _ = _typed(node.this, columns, {STRING})
        return f"CAST(length({a}) AS INTEGER)", INT  # Spark: int count of code points
    if t is exp.Abs:
        _only(node, "this")
        a, typ = _translate(node.this, columns)
        if _decimal_of(typ) is not None:
            _exactly_negated(typ)
        elif typ not in _ARITH:
            raise _Refuse(f"operand type {typ}")
        return f"abs({a})", typ  # a decimal's: the same type in both
    return _function(node, columns)


# Boolean-level constructs, which must not be the direct operand of a comparison or predicate
# in sqlglot's tree without a Paren node. A backstop behind ``_check_one_comparison_per_operand``
# (which sees the user's parentheses; sqlglot also adds Paren nodes of its own): it refuses what
# Spark's grammar rejects anyway, e.g. ``a = NOT b``.
_BOOLEAN_LEVEL = (*_COMPARISONS, exp.Is, exp.In, exp.Between, exp.Not, exp.And, exp.Or)


def _no_bare_predicate(*operands: exp.Expression) -> None:
    for operand in operands:
        if type(operand) in _BOOLEAN_LEVEL:
            raise _Refuse("unparenthesized comparison or predicate as an operand")


def _typed(node: exp.Expression, columns: Columns, allowed: set[str]) -> tuple[str, str]:
    sql, typ = _translate(node, columns)
    if typ not in allowed:
        raise _Refuse(f"operand type {typ}")
    return sql, typ


def _arithmetic(fn: str, left: exp.Expression, right: exp.Expression,
                columns: Columns) -> tuple[str, str]:
    a, ta = _translate(left, columns)
    b, tb = _translate(right, columns)
    if DOUBLE in (ta, tb):  # Spark takes a decimal beside a double as a double
        a, ta = _decimal_as_double(a, ta)
        b, tb = _decimal_as_double(b, tb)
    if _decimal_of(ta) is not None or _decimal_of(tb) is not None \
            or _integer_beside_decimal_literal(ta, tb):
        return _decimal_arithmetic(fn, (left, a, ta), (right, b, tb))
    for typ in (ta, tb):
        if typ not in _ARITH | {DECIMAL_LIT, NULL}:
            raise _Refuse(f"operand type {typ}")
    kinds = {ta, tb}
    if kinds <= {NULL}:
        raise _Refuse("NULL op NULL")
    if DECIMAL_LIT in kinds:
        # Spark: double op decimal is double (the decimal becomes a double), as in DuckDB. Any
        # other decimal arithmetic follows decimal precision rules that differ between the two.
        if kinds - {DECIMAL_LIT} != {DOUBLE}:
            raise _Refuse("decimal arithmetic")
        typ = DOUBLE
    elif DOUBLE in kinds:
        typ = DOUBLE
    elif BIGINT in kinds:
        typ = BIGINT
    else:
        typ = INT
    return f"{fn}({a}, {b})", typ


def _integer_beside_decimal_literal(ta: str, tb: str) -> bool:
    """Whether an operator's operands are an integer (not a literal: those fold) and a decimal
    literal: Spark computes ``minutes / 60.0`` or ``qty * 1.5`` in decimals (the integer as
    ``DECIMAL(10,0)`` or ``DECIMAL(20,0)``, the literal of its own digits), as
    ``_decimal_arithmetic`` and ``_decimal_division`` do."""
    literals = {DECIMAL_LIT, DECIMAL_WIDE}
    return bool({ta, tb} & literals) and bool({ta, tb} - literals) \
        and {ta, tb} - literals <= {INT, BIGINT}


def _division(left: exp.Expression, right: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``a / b`` of int, bigint and double (a decimal literal only beside a double): Spark
    divides as doubles (``CAST`` of both) and, in ANSI mode, raises on a zero divisor, where
    DuckDB would give NULL; so a zero divisor raises in DuckDB too (``error``), and the caller
    lets Spark decide, as for an overflow. With a decimal operand: ``_decimal_division``."""
    a, ta = _translate(left, columns)
    b, tb = _translate(right, columns)
    if _decimal_of(ta) is not None or _decimal_of(tb) is not None \
            or _integer_beside_decimal_literal(ta, tb):
        return _decimal_division((left, a, ta), (right, b, tb))
    for typ in (ta, tb):
        if typ not in _ARITH | {DECIMAL_LIT, NULL}:
            raise _Refuse(f"operand type {typ}")
    kinds = {ta, tb}
    if kinds <= {NULL}:
        raise _Refuse("NULL / NULL")
    if DECIMAL_LIT in kinds and kinds - {DECIMAL_LIT, NULL} != {DOUBLE}:
        raise _Refuse("decimal division")
    return (f"(CASE WHEN ({b}) = 0 THEN error('division by zero') "
            f"ELSE CAST({a} AS DOUBLE) / CAST({b} AS DOUBLE) END)"), DOUBLE


# --- decimals ----------------------------------------------------------------------------------

_DECIMAL_TAG = re.compile(r"decimal\((\d+),(\d+)\)")


def _decimal_tag(precision: int, scale: int) -> str:
    """The type tag of a ``DECIMAL(precision, scale)`` value."""
    return f"decimal({precision},{scale})"


def _decimal_of(tag: str) -> tuple[int, int] | None:
    """(precision, scale) of a decimal type tag; None for any other tag."""
    m = _DECIMAL_TAG.fullmatch(tag)
    return (int(m.group(1)), int(m.group(2))) if m else None


#: the decimal type an integral operand takes beside a decimal (``DecimalType.forType``)
_INTEGRAL_DECIMALS = {INT: (10, 0), BIGINT: (20, 0)}


#: the most digits Spark negates exactly: its ``Decimal.unary_-`` (and so ``abs`` of a negative
#: value) goes through a Scala ``BigDecimal`` of 34 digits (``MathContext.DECIMAL128``), so a
#: wider value comes back rounded half even to 34 significant digits, or raises where that
#: rounding leaves the type; DuckDB negates exactly
_NEGATED_DIGITS = 34


def _exactly_negated(tag: str) -> None:
    """Refuse ``-x`` and ``abs(x)`` of a decimal type Spark may not negate exactly."""
    decimal = _decimal_of(tag)
    if decimal is not None and decimal[0] > _NEGATED_DIGITS:
        raise _Refuse(f"unary minus of a decimal of {decimal[0]} digits")


def _decimal_operand(node: exp.Expression, tag: str, *, narrow: bool) -> tuple[int, int]:
    """The decimal type Spark gives an operand beside a decimal: its own for a decimal, a
    literal's digits for a decimal literal or fold (``_decimal_value``), ``DECIMAL(10,0)`` and
    ``DECIMAL(20,0)`` for an int and a bigint, except an integer literal beside a decimal in an
    arithmetic or comparison operator (``narrow``), which takes its own digits
    (``spark.sql.legacy.literal.pickMinimumPrecision``, on by default). A double (Spark takes
    the decimal as a double, rounding differently from DuckDB) and anything else refuses."""
    own = _decimal_of(tag)
    if own is not None:
        return own
    if tag in (DECIMAL_LIT, DECIMAL_WIDE) or (tag in _INTEGRAL_DECIMALS and narrow
                                              and _int_literal(node) is not None):
        typed = _decimal_value(node)
        if typed is None:
            raise _Refuse("decimal literal type")
        return typed[2], typed[3]
    if tag in _INTEGRAL_DECIMALS:
        return _INTEGRAL_DECIMALS[tag]
    raise _Refuse(f"{tag} beside a decimal")


def _wider_decimal(types: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """Spark's common type of decimals (``DecimalPrecision.widerDecimalType``): the most
    integer digits and the most fractional ones. Past 38 digits Spark bounds it, and a value
    cast to it may overflow where DuckDB compares exactly: refused."""
    scale = max(s for _, s in types)
    precision = max(p - s for p, s in types) + scale
    if precision > 38:
        raise _Refuse("a common decimal type past 38 digits")
    return precision, scale


def _as_decimal(sql: str, typ: tuple[int, int]) -> str:
    return f"CAST({sql} AS DECIMAL({typ[0]}, {typ[1]}))"


_Operand: TypeAlias = tuple[exp.Expression, str, str]  # (node, DuckDB SQL, type tag)


def _decimal_arithmetic(fn: str, left: _Operand, right: _Operand) -> tuple[str, str]:
    """``+ - *`` with a decimal operand: Spark's result type (``spark_decimal.add_type`` /
    ``multiply_type``, a type past 38 digits adjusted to fewer fractional digits), and its
    value: the exact sum, difference or product, rounded half up (away from zero) to that
    type's scale where it has fewer fractional digits, raising where it does not fit, as
    Spark's ANSI mode does. Each operand is cast to 38 digits of the scale Spark takes it with;
    DuckDB's result is exact (its scale the exact one) and its cast to Spark's type rounds half
    away from zero too. Where the exact value has more than 38 digits (only where Spark rounds)
    DuckDB raises and Spark does not: the caller's fallback to Spark decides (see "Errors" in
    the module docstring). Refused: a NULL or a double operand, an exact scale past 38."""
    if NULL in (left[2], right[2]):
        raise _Refuse("NULL beside a decimal")
    (p1, s1), (p2, s2) = (_decimal_operand(node, tag, narrow=True) for node, _, tag in
                          (left, right))
    if fn == "multiply":
        exact_scale = s1 + s2
        precision, scale = spark_decimal.multiply_type(p1, s1, p2, s2)
    else:
        exact_scale = max(s1, s2)
        precision, scale = spark_decimal.add_type(p1, s1, p2, s2)
    if exact_scale > 38:
        raise _Refuse("an exact decimal scale past 38")
    # 38 digits each: DuckDB computes in its operands' width (a DECIMAL(15,2) times a
    # DECIMAL(13,4) is a DECIMAL(18,6) to it, overflowing at 18 digits)
    sql = f"{fn}({_as_decimal(left[1], (38, s1))}, {_as_decimal(right[1], (38, s2))})"
    return _as_decimal(sql, (precision, scale)), _decimal_tag(precision, scale)


#: the longest operand a decimal division repeats (four times, and nested divisions again)
_DIVISION_OPERAND_CHARS = 2_000


def _decimal_division(left: _Operand, right: _Operand) -> tuple[str, str]:
    """``a / b`` with a decimal operand (the other a decimal, an int, a bigint or a literal):
    Spark's result type (``spark_decimal.divide_type``, adjusted past 38 digits) and value,
    the exact quotient cut to 39 fractional digits then rounded half up to the type's scale
    ``S``, which is the exact quotient rounded half up to ``S`` (half up looks only at the
    first digit dropped, which the cut keeps). DuckDB divides decimals as doubles, so this is
    integer arithmetic on the unscaled values in 128 bits: ``N = A * 10^(S + s2 - s1)``, the
    truncated ``N // B`` moved one away from zero where the remainder is at least half of
    ``B``, scaled back by ``10^-S``. A zero divisor raises (``error``), as Spark's ANSI mode
    does unless the dividend is NULL; past 128 bits DuckDB raises where Spark may not: the
    caller's fallback to Spark decides, as for integer division by zero."""
    if NULL in (left[2], right[2]):
        raise _Refuse("NULL beside a decimal")
    if max(len(left[1]), len(right[1])) > _DIVISION_OPERAND_CHARS:
        raise _Refuse("a decimal division of long operands")
    (p1, s1), (p2, s2) = (_decimal_operand(node, tag, narrow=True) for node, _, tag in
                          (left, right))
    precision, scale = spark_decimal.divide_type(p1, s1, p2, s2)
    shift = scale + s2 - s1
    if shift < 0:
        raise _Refuse("a decimal quotient of fewer fractional digits than its dividend")
    a = f"{_unscaled(_as_decimal(left[1], (p1, s1)))} * {10 ** shift}::HUGEINT"
    b = _unscaled(_as_decimal(right[1], (p2, s2)))
    rounded = (f"(({a}) // ({b}) + CASE WHEN abs(({a}) % ({b})) >= abs({b}) - abs(({a}) % "
               f"({b})) THEN sign({a}) * sign({b}) ELSE 0 END)")
    value = f"CAST({rounded} AS DECIMAL(38, 0))"
    if scale:
        value = f"multiply({value}, {_as_decimal(f'1e-{scale}', (scale, scale))})"
    return (f"(CASE WHEN ({b}) = 0 THEN error('division by zero') ELSE "
            f"{_as_decimal(value, (precision, scale))} END)"), _decimal_tag(precision, scale)


def _unscaled(decimal_sql: str) -> str:
    """The unscaled integer of a decimal (``12.50``: 1250), as a HUGEINT: its text without
    the point (DuckDB writes every fractional digit of the type, never an exponent)."""
    return f"CAST(replace(CAST({decimal_sql} AS VARCHAR), '.', '') AS HUGEINT)"


def _decimal_comparison(op: str, left: _Operand, right: _Operand) -> str:
    """A comparison with a decimal operand: exact in both engines once both sides are cast to
    their common decimal type (``_wider_decimal``); against NULL, NULL in both."""
    if NULL in (left[2], right[2]):
        if OTHER in (left[2], right[2]):
            raise _Refuse("comparison with a pass-through type")
        return f"({left[1]} {op} {right[1]})"
    types = [_decimal_operand(node, tag, narrow=True) for node, _, tag in (left, right)]
    wide = _wider_decimal(types)
    return f"({_as_decimal(left[1], wide)} {op} {_as_decimal(right[1], wide)})"


def _decimal_branches(values: Sequence[_Operand]) -> tuple[list[str], str]:
    """The values of CASE branches or COALESCE arguments, one of them a decimal: each cast to
    Spark's common type (``_wider_decimal``; an integer literal counts as an int here: no
    literal narrowing outside arithmetic and comparisons), NULLs left as they are."""
    types = [_decimal_operand(node, tag, narrow=False) for node, _, tag in values
             if tag != NULL]
    wide = _wider_decimal(types)
    return ([sql if tag == NULL else _as_decimal(sql, wide) for _, sql, tag in values],
            _decimal_tag(*wide))


def _like(node: exp.Like, columns: Columns) -> tuple[str, str]:
    """``s [NOT] LIKE 'pattern'`` of a string with a literal pattern whose only wildcard is
    ``%`` (``_`` is one UTF-16 unit to Spark's Java regex, one code point to DuckDB; escapes
    are refused with every backslash)."""
    _only(node, "this", "expression", "negate")
    pattern = node.expression
    if type(pattern) is not exp.Literal or not pattern.is_string or "_" in pattern.this:
        raise _Refuse("LIKE pattern")
    _no_bare_predicate(node.this)
    a, _ = _typed(node.this, columns, {STRING})
    p, _ = _literal(pattern)
    return f"({a} {'NOT LIKE' if node.args.get('negate') else 'LIKE'} {p})", BOOLEAN


def _comparable(a: str, b: str) -> None:
    if NULL in (a, b) and OTHER not in (a, b):
        return
    if a in _NUMERIC and b in _NUMERIC and {a, b} != {DOUBLE, DECIMAL_WIDE}:
        return
    if a == b and a in (STRING, BOOLEAN, DATE, TIMESTAMP, TIMESTAMP_NTZ):
        return
    raise _Refuse(f"comparison {a} vs {b}")


def _unify(types: Sequence[str]) -> str:
    """The common type of CASE branches / COALESCE arguments, where Spark and DuckDB agree."""
    real = {t for t in types if t != NULL}
    if OTHER in real:
        raise _Refuse("pass-through type in an expression")
    if not real:
        return NULL
    if len(real) == 1:
        return real.pop()
    if real <= {INT, BIGINT}:
        return BIGINT
    if real <= {INT, BIGINT, DOUBLE} or real == {DOUBLE, DECIMAL_LIT}:
        return DOUBLE
    raise _Refuse(f"branch types {sorted(real)}")


def _in(node: exp.In, columns: Columns) -> tuple[str, str]:
    _only(node, "this", "expressions")
    items = node.expressions
    if not items:
        raise _Refuse("empty IN")
    _no_bare_predicate(node.this)
    x, tx = _translate(node.this, columns)
    sqls, types = [], {tx}
    for item in items:
        if not _is_literal(item):
            raise _Refuse("IN item not a literal")
        sql, typ = _translate(item, columns)
        sqls.append(sql)
        types.add(typ)
    for a in types:  # Spark finds one common type for the value and all the items
        for b in types:
            _comparable(a, b)
    return f"({x} IN ({', '.join(sqls)}))", BOOLEAN


def _case(node: exp.Case, columns: Columns) -> tuple[str, str]:
    _only(node, "this", "ifs", "default")
    ifs = node.args.get("ifs") or []
    if not ifs:
        raise _Refuse("CASE without WHEN")
    subject = None
    if node.this is not None:
        subject = _translate(node.this, columns)
    conditions: list[str] = []
    values: list[tuple[exp.Expression, str, str]] = []
    for branch in ifs:
        if type(branch) is not exp.If:
            raise _Refuse("CASE branch form")
        _only(branch, "this", "true")
        if subject is None:
            cond, _ = _typed(branch.this, columns, {BOOLEAN})  # Spark rejects WHEN NULL
        else:
            cond, tc = _translate(branch.this, columns)
            _comparable(subject[1], tc)
        val, tv = _translate(branch.args["true"], columns)
        conditions.append(f"WHEN {cond} THEN ")
        values.append((branch.args["true"], val, tv))
    default = node.args.get("default")
    if default is not None:
        val, tv = _translate(default, columns)
        conditions.append("ELSE ")
        values.append((default, val, tv))
    if any(_decimal_of(tv) is not None for _, _, tv in values):
        sqls, typ = _decimal_branches(values)
    else:
        sqls, typ = [val for _, val, _ in values], _unify([tv for _, _, tv in values])
    parts = [c + v for c, v in zip(conditions, sqls)]
    head = "CASE" if subject is None else f"CASE {subject[0]}"
    return f"({head} {' '.join(parts)} END)", typ


# --- functions of dates, timestamps and strings ---------------------------------------------

def _utc_wall_clock(sql: str, typ: str) -> str:
    """A TIMESTAMP (an instant: DuckDB's TIMESTAMPTZ from Arrow's UTC timestamps) as its wall
    clock in UTC, the engine's Spark session time zone, whatever DuckDB's own time zone is; a
    TIMESTAMP_NTZ as it is."""
    return f"timezone('UTC', {sql})" if typ == TIMESTAMP else sql


def _as_date(node: exp.Expression, columns: Columns) -> str:
    """A DATE, or a TIMESTAMP(_NTZ)'s date in the session time zone (UTC), as Spark casts a
    timestamp where a function takes a date."""
    a, typ = _typed(node, columns, {DATE, TIMESTAMP, TIMESTAMP_NTZ})
    return a if typ == DATE else f"CAST({_utc_wall_clock(a, typ)} AS DATE)"


def _date_part(part: str, node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """A part of a date or a timestamp (in UTC) as Spark's int. ``dayofweek``: Spark counts
    Sunday as 1, DuckDB as 0; ``weekofyear``: the ISO week in both."""
    a, typ = _typed(node, columns, {DATE, TIMESTAMP, TIMESTAMP_NTZ})
    if part in _TIME_PARTS and typ == DATE:
        raise _Refuse("a time part of a date")
    value = f"{part}({_utc_wall_clock(a, typ)})"
    if part == "dayofweek":
        value = f"({value} + 1)"
    return f"CAST({value} AS INTEGER)", INT


#: Spark's ``date_trunc`` units (upper-cased) and DuckDB's
_TIMESTAMP_UNITS = {"YEAR": "year", "YYYY": "year", "YY": "year", "QUARTER": "quarter",
                    "MONTH": "month", "MM": "month", "MON": "month", "WEEK": "week",
                    "DAY": "day", "DD": "day", "HOUR": "hour", "MINUTE": "minute",
                    "SECOND": "second", "MILLISECOND": "millisecond",
                    "MICROSECOND": "microsecond"}
#: Spark's ``trunc(date, fmt)`` formats and DuckDB's unit
_DATE_UNITS = {k: v for k, v in _TIMESTAMP_UNITS.items()
               if v in ("year", "quarter", "month", "week")}
_STRING_TESTS: dict[type[exp.Expression], str] = {
    exp.StartsWith: "starts_with", exp.EndsWith: "ends_with", exp.Contains: "contains"}
_CASE_MAPS: dict[type[exp.Expression], str] = {exp.Upper: "upper", exp.Lower: "lower"}
_TRIMS = {None: "trim", "BOTH": "trim", "LEADING": "ltrim", "TRAILING": "rtrim"}


def _unit(node: exp.Expression | None, units: dict[str, str]) -> str:
    """The DuckDB unit of a literal Spark unit (``'MONTH'``, or sqlglot's ``Var``)."""
    if type(node) is exp.Var or (type(node) is exp.Literal and node.is_string):
        unit = units.get(str(node.name).upper())
        if unit is not None:
            return unit
    raise _Refuse("unit")  # not a literal, or one Spark reads as NULL


def _cast_to(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``CAST(x AS t)`` (Spark's ANSI cast; sqlglot reads it as TRY_CAST) where both engines
    convert alike: a date literal and ``TIMESTAMP '...'`` (``_timestamp_literal``); to DATE
    from a date or a timestamp (its UTC date); to STRING from an integer or a string; to INT,
    BIGINT or DOUBLE from an integer (an INT out of range raises in both); to DOUBLE from a
    double, or a decimal of at most 15 digits (``_decimal_as_double``); to BIGINT from a
    TIMESTAMP, its seconds since 1970 UTC rounded down, as Spark's cast does. Not from a double
    to an integer (DuckDB rounds, Spark truncates) nor a string to a number (they parse
    differently)."""
    if _date_value(node) is not None:
        return _date_literal(node)
    to = node.args["to"]
    if type(to) is not exp.DataType or to.expressions:
        raise _Refuse("CAST type")
    target = to.this
    if target in (exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIMESTAMPLTZ):
        _only(node, "this", "to", "_type")  # TIMESTAMP '...' (Spark's TIMESTAMP is local)
        literal = _timestamp_literal(node.this)
        if literal is None:
            raise _Refuse("TIMESTAMP literal")
        return literal, TIMESTAMP
    _only(node, "this", "to")
    if target == exp.DataType.Type.DATE:
        return _as_date(node.this, columns), DATE
    if target in (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR) and not to.args.get(
            "expressions"):
        a, _ = _typed(node.this, columns, {INT, BIGINT, STRING})
        return f"CAST({a} AS VARCHAR)", STRING
    numeric = {exp.DataType.Type.INT: (INT, "INTEGER"), exp.DataType.Type.BIGINT:
               (BIGINT, "BIGINT"), exp.DataType.Type.DOUBLE: (DOUBLE, "DOUBLE")}
    if target in numeric:
        typ, duck = numeric[target]
        a, given = _translate(node.this, columns)
        if typ == DOUBLE and _decimal_of(given) is not None:
            return _decimal_as_double(a, given)
        if typ == BIGINT and given == TIMESTAMP:  # Spark: Math.floorDiv(micros, 1000000)
            return _floor_divided(_epoch_micros(a), 1_000_000), BIGINT
        if given not in {INT, BIGINT, DOUBLE}:
            raise _Refuse(f"operand type {given}")
        if given == DOUBLE and typ != DOUBLE:
            raise _Refuse("CAST of a double to an integer")  # DuckDB rounds, Spark truncates
        return f"CAST({a} AS {duck})", typ
    raise _Refuse("CAST type")


#: the most digits of a decimal whose double both engines compute alike: the unscaled value
#: and the power of ten are exact doubles, so Spark's division of one by the other and
#: DuckDB's conversion are both the correctly rounded double
_DOUBLE_EXACT_DIGITS = 15


def _decimal_as_double(sql: str, typ: str) -> tuple[str, str]:
    """A decimal operand of at most ``_DOUBLE_EXACT_DIGITS`` digits as the double Spark makes
    of it beside a double (a wider one refuses: Spark rounds its unscaled value to a double
    first); any other operand as it is."""
    decimal = _decimal_of(typ)
    if decimal is None:
        return sql, typ
    if decimal[0] > _DOUBLE_EXACT_DIGITS:
        raise _Refuse("a decimal of more than 15 digits as a double")
    return f"CAST({sql} AS DOUBLE)", DOUBLE


#: the timestamp and date strings read here as Spark reads them, and no others
_TIMESTAMP_TEXT = re.compile(
    r"(\d{4}-\d{2}-\d{2})(?: (\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?)?")


def _timestamp_literal(node: exp.Expression) -> str | None:
    """A string literal ``yyyy-mm-dd[ hh:mm[:ss[.ffffff]]]`` of a valid time as the TIMESTAMP
    Spark reads it (in the session time zone, UTC): DuckDB's TIMESTAMPTZ with the offset
    written, so DuckDB's own time zone does not move it; None for any other node or text."""
    if type(node) is not exp.Literal or not node.is_string:
        return None
    m = _TIMESTAMP_TEXT.fullmatch(str(node.this))
    if m is None:
        return None
    try:
        day = datetime.date.fromisoformat(m.group(1))
        moment = datetime.datetime(day.year, day.month, day.day, int(m.group(2) or 0),
                                   int(m.group(3) or 0), int(m.group(4) or 0),
                                   int((m.group(5) or "0").ljust(6, "0")))
    except ValueError:
        return None
    return f"TIMESTAMPTZ '{moment.isoformat(sep=' ')}+00:00'"


def _coerced(other: str, node: exp.Expression, sql: str, typ: str) -> tuple[str, str]:
    """An operand of a comparison with a value of type ``other``, as Spark's ANSI coercion
    makes it: a DATE beside a TIMESTAMP is its midnight in UTC; a string literal beside a
    TIMESTAMP or a DATE is that time or date (only ``yyyy-mm-dd[ hh:mm[:ss[.ffffff]]]``; a
    date only ``yyyy-mm-dd``). Anything else as it is."""
    if other == TIMESTAMP and typ == DATE:
        return f"timezone('UTC', CAST({sql} AS TIMESTAMP))", TIMESTAMP
    if other == TIMESTAMP and typ == STRING:
        literal = _timestamp_literal(node)
        return (sql, typ) if literal is None else (literal, TIMESTAMP)
    if other == DATE and typ == STRING and type(node) is exp.Literal and node.is_string \
            and _DATE_RE.fullmatch(str(node.this)):
        try:
            return f"DATE '{datetime.date.fromisoformat(str(node.this)).isoformat()}'", DATE
        except ValueError:
            pass
    return sql, typ


def _function(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """The functions of dates, timestamps and strings both engines compute alike, each where
    its rows allow (see the module docstring); raises _Refuse for any other node."""
    t = type(node)
    if t in (exp.Cast, exp.TryCast):
        return _cast_to(node, columns)
    if t is exp.TsOrDsToDate:  # to_date(x) without a format
        _only(node, "this", "safe")
        return _as_date(node.this, columns), DATE
    if t is exp.TimestampTrunc:  # date_trunc(unit, x): a TIMESTAMP, truncated in UTC
        _only(node, "this", "unit")
        unit = _unit(node.args.get("unit"), _TIMESTAMP_UNITS)
        a, typ = _typed(node.this, columns, {DATE, TIMESTAMP})
        wall = f"CAST({a} AS TIMESTAMP)" if typ == DATE else _utc_wall_clock(a, typ)
        return f"timezone('UTC', date_trunc('{unit}', {wall}))", TIMESTAMP
    if t is exp.DateTrunc:  # trunc(date, fmt): a DATE
        _only(node, "this", "unit")
        unit = _unit(node.args.get("unit"), _DATE_UNITS)
        return f"CAST(date_trunc('{unit}', {_as_date(node.this, columns)}) AS DATE)", DATE
    if t is exp.TsOrDsAdd:  # date_add(d, n); date_sub(d, n) is date_add(d, n * -1)
        _only(node, "this", "expression", "unit")
        if _unit(node.args.get("unit"), {"DAY": "day"}) != "day":
            raise _Refuse("unit")
        days, sign = node.expression, "+"
        if type(days) is exp.Mul and _int_literal(days.expression) == -1:
            _only(days, "this", "expression")
            days, sign = days.this, "-"
        n, _ = _typed(days, columns, {INT})
        return f"({_as_date(node.this, columns)} {sign} {n})", DATE
    if t is exp.TimestampDiff or (t is exp.DateDiff and node.args.get("unit") is not None):
        return _timestamp_diff(node, columns)  # timestampdiff/datediff(unit, start, end)
    if t is exp.DateDiff:  # datediff(end, start): days, an int
        _only(node, "this", "expression")
        ends = []
        for arg in (node.this, node.expression):
            if type(arg) is exp.TsOrDsToDate:
                _only(arg, "this")
                arg = arg.this
            ends.append(_as_date(arg, columns))
        return f"CAST(({ends[0]} - {ends[1]}) AS INTEGER)", INT
    if t in _CASE_MAPS:
        # Java's full case mapping (``upper('ß')`` is ``'SS'``) and DuckDB's differ beyond
        # ASCII: a string with another character raises, and Spark decides that step
        _only(node, "this")
        a, _ = _typed(node.this, columns, {STRING})
        return (f"(CASE WHEN strlen({a}) <> length({a}) THEN error('not ASCII: Spark maps its "
                f"case') ELSE {_CASE_MAPS[t]}({a}) END)"), STRING
    if t in (exp.Concat, exp.DPipe):  # NULL if any is (|| in DuckDB; its concat skips NULLs)
        if t is exp.Concat:
            _only(node, "expressions", "safe", "coalesce")
            if node.args.get("coalesce") or not node.args.get("safe"):
                raise _Refuse("concat skipping NULLs, or adjacent literals ('a' 'b')")
            parts = list(node.expressions)
        else:
            _only(node, "this", "expression", "safe")
            parts = [node.this, node.expression]
        if not parts:
            raise _Refuse("concat()")
        sqls = [_typed(p, columns, {STRING})[0] for p in parts]
        return f"({' || '.join(sqls)})", STRING
    if t is exp.Trim:  # spaces (U+0020) only, as Spark's trim
        _only(node, "this", "position")
        fn = _TRIMS.get(node.args.get("position"))
        if fn is None:
            raise _Refuse("trim position")
        a, _ = _typed(node.this, columns, {STRING})
        return f"{fn}({a}, ' ')", STRING
    if t is exp.Replace:  # an empty search string leaves the string as it is, in both
        _only(node, "this", "expression", "replacement")
        a, _ = _typed(node.this, columns, {STRING})
        search, _ = _typed(node.expression, columns, {STRING})
        replacement = node.args.get("replacement")
        r = "''" if replacement is None else _typed(replacement, columns, {STRING})[0]
        return f"replace({a}, {search}, {r})", STRING
    if t in _STRING_TESTS:
        _only(node, "this", "expression")
        a, _ = _typed(node.this, columns, {STRING})
        b, _ = _typed(node.expression, columns, {STRING})
        return f"{_STRING_TESTS[t]}({a}, {b})", BOOLEAN
    if t is exp.Nullif:  # NULL where a = b, else a (of a's type)
        _only(node, "this", "expression")
        a, ta = _translate(node.this, columns)
        b, tb = _translate(node.expression, columns)
        if _decimal_of(ta) is not None or _decimal_of(tb) is not None or NULL in (ta, tb):
            raise _Refuse("nullif of decimals or NULL")
        _comparable(ta, tb)
        return f"(CASE WHEN {a} = {b} THEN NULL ELSE {a} END)", ta
    if t is exp.LastDay:  # the month's last day of a date (or a timestamp's date)
        _only(node, "this")
        return f"last_day({_as_date(node.this, columns)})", DATE
    if t in (exp.Greatest, exp.Least):  # NULLs skipped, the first of equals kept in both
        _only(node, "this", "expressions", "ignore_nulls")
        parts = [_typed(a, columns, {INT, BIGINT, DOUBLE, STRING, DATE})
                 for a in [node.this, *node.expressions]]
        typ = _unify([p[1] for p in parts])
        fn = "greatest" if t is exp.Greatest else "least"
        return f"{fn}({', '.join(p[0] for p in parts)})", typ
    if t is exp.If:  # if(c, a, b) is CASE WHEN c THEN a ELSE b END
        _only(node, "this", "true", "false")
        return _case(exp.Case(ifs=[exp.If(this=node.this, true=node.args["true"])],
                              default=node.args.get("false")), columns)
    if t is exp.Mod:  # of integers: the sign of the dividend in both; Spark decides x % 0
        _only(node, "this", "expression")
        a, ta = _typed(node.this, columns, {INT, BIGINT})
        b, tb = _typed(node.expression, columns, {INT, BIGINT})
        return (f"(CASE WHEN {b} = 0 THEN error('remainder by zero: Spark decides') "
                f"ELSE ({a} % {b}) END)"), BIGINT if BIGINT in (ta, tb) else INT
    if t in (exp.Floor, exp.Ceil):  # a BIGINT in Spark; NaN (Spark: 0), infinities and
        _only(node, "this")         # values past BIGINT raise in DuckDB's cast: Spark decides
        a, typ = _typed(node.this, columns, {INT, BIGINT, DOUBLE})
        fn = "floor" if t is exp.Floor else "ceil"
        return (f"CAST({fn}({a}) AS BIGINT)" if typ == DOUBLE else f"CAST({a} AS BIGINT)"), \
            BIGINT
    if t is exp.Round:  # round(x[, scale]): half up; bround(x[, scale]) below: half even
        _only(node, "this", "decimals")
        return _rounded(node.this, node.args.get("decimals"), columns, half_even=False)
    if t is exp.Anonymous and str(node.this).lower() == "bround":
        _only(node, "this", "expressions")
        if not 1 <= len(node.expressions) <= 2:
            raise _Refuse("bround arguments")
        scale = node.expressions[1] if len(node.expressions) == 2 else None
        return _rounded(node.expressions[0], scale, columns, half_even=True)
    if t is exp.TimeToStr:  # date_format(x, 'pattern')
        return _date_format(node, columns)
    if t is exp.StrToUnix or t in _EPOCH_UNITS:  # unix_timestamp(x), unix_seconds(x), ...
        return _unix_time(node, columns)
    if t is exp.Pad:  # lpad(s, n[, pad]), rpad(s, n[, pad])
        return _pad(node, columns)
    if t is exp.ConcatWs:  # concat_ws(sep, s, ...): NULLs skipped
        return _concat_ws(node, columns)
    if t in (exp.Left, exp.Right):  # left(s, n), right(s, n)
        return _left_right(node, columns)
    if t is exp.AddMonths:  # add_months(d, n)
        return _add_months(node, columns)
    if t in (exp.Sqrt, exp.Sign):  # sqrt(x), sign(x)/signum(x): doubles
        return _sqrt_sign(node, columns)
    if t is exp.Anonymous and str(node.this).lower() == "make_date":
        return _make_date(node, columns)
    if t is exp.Initcap:  # initcap(s) of ASCII strings
        return _initcap(node, columns)
    if t is exp.Bracket:  # split(s, 'sep')[i], element_at(split(s, 'sep'), i)
        return _split_part(node, columns)
    raise _Refuse(f"node {t.__name__}")


# --- date_format, epoch numbers, padding and joining strings -----------------------------------

#: Spark's ``date_format`` pattern letters translated here, and the counts of each (a run of
#: one letter is one field; any other count or letter refuses)
_PATTERN_COUNTS = {"y": {1, 2, 4}, "M": {1, 2, 3, 4}, "d": {1, 2}, "H": {1, 2}, "m": {1, 2},
                   "s": {1, 2}, "S": {1, 2, 3, 4, 5, 6}, "E": {1, 2, 3, 4}}
#: the characters a pattern may hold outside quotes besides the letters above (each itself)
_PATTERN_SEPARATORS = frozenset(" -/:.,_")
#: the DuckDB functions of the numeric fields
_PATTERN_PARTS = {"y": "year", "M": "month", "d": "day", "H": "hour", "m": "minute",
                  "s": "second"}
_SHORT_DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
_DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_SHORT_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                 "Dec"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]


def _pattern_fields(pattern: str) -> list[tuple[str, int] | str]:
    """Spark's datetime pattern as fields ``(letter, count)`` and literal texts (adjacent ones
    joined), read as Java's ``DateTimeFormatterBuilder.appendPattern`` reads it: a quote starts
    a literal that ends at the next lone quote (``''`` inside is one quote, and so is an empty
    literal ``''``). Spark rewrites only the unquoted parts (``y`` as ``u``, the proleptic
    year). Letters and counts outside ``_PATTERN_COUNTS``, other characters outside quotes and
    a quote left open refuse."""
    out: list[tuple[str, int] | str] = []

    def text(t: str) -> None:
        if out and isinstance(out[-1], str):
            out[-1] += t
        else:
            out.append(t)

    k = 0
    while k < len(pattern):
        c = pattern[k]
        if c == "'":
            end = k + 1
            while end < len(pattern) and (pattern[end] != "'" or pattern.startswith("''", end)):
                end += 2 if pattern.startswith("''", end) else 1
            if end >= len(pattern):
                raise _Refuse("a pattern ending in an open quote")
            text(pattern[k + 1:end].replace("''", "'") or "'")
            k = end + 1
        elif c in _PATTERN_COUNTS:
            n = len(pattern) - k - len(pattern[k:].lstrip(c))
            if n not in _PATTERN_COUNTS[c]:
                raise _Refuse(f"pattern letters {c * n}")
            out.append((c, n))
            k += n
        elif c in _PATTERN_SEPARATORS:
            text(c)
            k += 1
        else:
            raise _Refuse(f"pattern character {c!r}")
    return out


def _list_literal(texts: Sequence[str]) -> str:
    return "[" + ", ".join(exp.Literal.string(t).sql(dialect="duckdb") for t in texts) + "]"


def _pattern_piece(field: tuple[str, int], wall: str) -> str:
    """One field of a pattern as DuckDB text of the wall clock ``wall`` (a TIMESTAMP of a year
    1 to 9999): a number zero-padded to the letters' count (it never has more digits than that
    count, which ``lpad`` would cut), ``yy`` the year's last two digits, ``S``... the fraction
    of the second cut (not rounded) to as many digits, names in English (Spark formats in its
    default locale, ``Locale.US``; ``E``, ``EE`` and ``EEE`` all abbreviate)."""
    letter, n = field
    if letter == "E":
        names = _DAYS if n == 4 else _SHORT_DAYS
        return f"({_list_literal(names)}[dayofweek({wall}) + 1])"  # DuckDB: Sunday 0
    if letter == "M" and n >= 3:
        names = _MONTHS if n == 4 else _SHORT_MONTHS
        return f"({_list_literal(names)}[month({wall})])"
    if letter == "S":  # DuckDB's microsecond() counts from the minute
        value = f"((microsecond({wall}) % 1000000) // {10 ** (6 - n)})"
    elif letter == "y" and n == 2:
        value = f"(year({wall}) % 100)"
    else:
        value = f"{_PATTERN_PARTS[letter]}({wall})"
    text = f"CAST({value} AS VARCHAR)"
    return text if n == 1 and letter != "S" else f"lpad({text}, {n}, '0')"


def _date_format(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``date_format(x, 'pattern')`` of a DATE, a TIMESTAMP or a TIMESTAMP_NTZ with a literal
    pattern of ``_PATTERN_COUNTS``' letters (``y yy yyyy M MM MMM MMMM d dd H HH m mm s ss``,
    ``S`` to ``SSSSSS``, ``E EE EEE EEEE``), the separators `` -/:.,_`` and quoted text, the
    pattern as the user wrote it (``_mark_date_formats``). Spark formats the timestamp (a
    date: its midnight; a TIMESTAMP_NTZ: the same wall clock) in the session time zone, UTC,
    so this is built of the parts of the UTC wall clock, as the date parts are. Years outside
    1 to 9999 (Spark writes ``+10000``, and a sign before year 1; DuckDB's infinite timestamps
    have no parts) raise (``error()``), and Spark decides that step."""
    _only(node, "this", "format")
    pattern = node.meta.get(_PATTERN)
    if pattern is None:
        raise _Refuse("date_format pattern not read from the text")
    arg = node.this
    if type(arg) is not exp.TimeStrToTime:
        raise _Refuse("date_format operand")
    _only(arg, "this")
    a, typ = _typed(arg.this, columns, {DATE, TIMESTAMP, TIMESTAMP_NTZ})
    wall = f"CAST({a} AS TIMESTAMP)" if typ == DATE else _utc_wall_clock(a, typ)
    pieces = [exp.Literal.string(f).sql(dialect="duckdb") if isinstance(f, str)
              else _pattern_piece(f, wall) for f in _pattern_fields(pattern)]
    body = " || ".join(pieces) if pieces else "''"
    return (f"(CASE WHEN year({wall}) BETWEEN 1 AND 9999 THEN ({body}) WHEN {a} IS NULL THEN "
            f"NULL ELSE error('date_format of a year outside 1 to 9999: Spark decides') END)"
            ), STRING


#: ``unix_seconds``, ``unix_millis``, ``unix_micros``: the microseconds in each unit
_EPOCH_UNITS: dict[type[exp.Expression], int] = {
    exp.UnixSeconds: 1_000_000, exp.UnixMillis: 1_000, exp.UnixMicros: 1}


def _epoch_micros(sql: str) -> str:
    """The microseconds of a TIMESTAMP since 1970-01-01 00:00 UTC (a TIMESTAMP_NTZ's wall
    clock read in UTC), a BIGINT, exact in DuckDB's ``epoch_us`` whatever its time zone; its
    infinities (Spark's largest and smallest-but-one timestamps, which Spark counts) raise."""
    return (f"(CASE WHEN NOT isfinite({sql}) THEN error('an infinite DuckDB timestamp: Spark "
            f"decides') ELSE epoch_us({sql}) END)")


def _floor_divided(sql: str, divisor: int) -> str:
    """``floor(sql / divisor)`` of a BIGINT in integers (DuckDB's ``//`` cuts toward zero)."""
    if divisor == 1:
        return sql
    return f"({sql} // {divisor} - (CASE WHEN {sql} % {divisor} < 0 THEN 1 ELSE 0 END))"


def _unix_time(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """Spark's epoch numbers, each a BIGINT: ``unix_seconds``, ``unix_millis``,
    ``unix_micros`` of a TIMESTAMP or a TIMESTAMP_NTZ (its wall clock in UTC) round down
    (``Math.floorDiv``: 1969-12-31 23:59:59.5 is -1 second); ``unix_timestamp(x)`` (one
    argument, ``_mark_unix_timestamps``) of those cuts toward zero (Java's ``/``: the same
    instant is 0), and of a DATE is its midnight in UTC (DuckDB's cast to TIMESTAMP raises
    on exactly the dates whose midnight overflows Spark's microseconds, where Spark raises)."""
    if type(node) is exp.StrToUnix:
        _only(node, "this", "format")
        if not node.meta.get(_ONE_ARGUMENT):
            raise _Refuse("unix_timestamp() or unix_timestamp(x, format)")
        a, typ = _typed(node.this, columns, {DATE, TIMESTAMP, TIMESTAMP_NTZ})
        if typ == DATE:
            a = f"CAST({a} AS TIMESTAMP)"
        return f"({_epoch_micros(a)} // 1000000)", BIGINT
    _only(node, "this")
    a, _ = _typed(node.this, columns, {TIMESTAMP, TIMESTAMP_NTZ})
    return _floor_divided(_epoch_micros(a), _EPOCH_UNITS[type(node)]), BIGINT


#: the longest ``lpad``/``rpad`` length translated (past it, memory decides in either engine)
_PAD_MAX = 1_000_000


def _empty_unless_null(sql: str) -> str:
    return f"(CASE WHEN {sql} IS NULL THEN NULL ELSE '' END)"


def _pad(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``lpad(s, n[, pad])`` and ``rpad`` of a string with an integer literal ``n`` (up to
    ``_PAD_MAX``) and a string literal ``pad`` (a space if omitted), counting code points as
    both engines do: ``n <= 0`` gives '' (DuckDB too, but written out), a longer string is
    cut to its first ``n`` code points (by both functions, in both engines), the pad repeats
    from its start. An empty pad leaves a shorter string as it is in Spark where DuckDB
    raises: ``substring(s, 1, n)`` then."""
    _only(node, "this", "expression", "fill_pattern", "is_left")
    a, _ = _typed(node.this, columns, {STRING})
    n = _int_literal(node.expression)
    if n is None or not _INT_MIN <= n <= _PAD_MAX:
        raise _Refuse("pad length")
    fill = node.args.get("fill_pattern")
    if fill is None:
        fill = exp.Literal.string(" ")
    if type(fill) is not exp.Literal or not fill.is_string:
        raise _Refuse("pad not a string literal")
    if n <= 0:
        return _empty_unless_null(a), STRING
    if fill.this == "":
        return f"substring({a}, 1, {n})", STRING
    fn = "lpad" if node.args.get("is_left") else "rpad"
    return f"{fn}({a}, {n}, {_literal(fill)[0]})", STRING


def _concat_ws(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``concat_ws(sep, s, ...)`` of strings (and NULLs): both skip NULL strings and give NULL
    for a NULL separator; Spark's ``concat_ws(sep)`` is '' (DuckDB's wants a string)."""
    _only(node, "expressions", "safe", "coalesce", "flatten")
    if not node.expressions:
        raise _Refuse("concat_ws()")
    sep, *parts = [_typed(e, columns, {STRING, NULL})[0] for e in node.expressions]
    if not parts:
        return _empty_unless_null(sep), STRING
    return f"concat_ws({sep}, {', '.join(parts)})", STRING


def _left_right(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``left(s, n)`` and ``right(s, n)`` of a string with an integer literal ``n``: the first
    or last ``n`` code points in both (the whole string if shorter); ``n <= 0`` gives '' in
    Spark, where DuckDB would drop ``-n`` code points from the other end: written out."""
    _only(node, "this", "expression")
    a, _ = _typed(node.this, columns, {STRING})
    n = _int_literal(node.expression)
    if n is None or not _INT_MIN <= n <= _INT_MAX:
        raise _Refuse("left/right length")
    if n <= 0:
        return _empty_unless_null(a), STRING
    return f"{'left' if type(node) is exp.Left else 'right'}({a}, {n})", STRING


# --- timestampdiff, add_months, sqrt and sign, make_date, initcap, split ------------------------

#: ``timestampdiff`` units of a fixed length in microseconds (the session time zone, UTC, has no
#: daylight saving time: every day is 86400 seconds), and the calendar units, in months
_DIFF_MICROS = {"MICROSECOND": 1, "MILLISECOND": 1_000, "SECOND": 1_000_000,
                "MINUTE": 60_000_000, "HOUR": 3_600_000_000, "DAY": 86_400_000_000,
                "WEEK": 604_800_000_000}
_DIFF_MONTHS = {"MONTH": 1, "QUARTER": 3, "YEAR": 12}
#: the longest operand a calendar difference repeats (each about a dozen times)
_DIFF_OPERAND_CHARS = 2_000


def _micros_of(node: exp.Expression, columns: Columns) -> str:
    """A DATE (its midnight in UTC, as Spark casts it to a TIMESTAMP), a TIMESTAMP or a
    TIMESTAMP_NTZ (its wall clock read in UTC, as Spark casts it) as microseconds since 1970."""
    a, typ = _typed(node, columns, {DATE, TIMESTAMP, TIMESTAMP_NTZ})
    return _epoch_micros(f"CAST({a} AS TIMESTAMP)" if typ == DATE else a)


def _timestamp_diff(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``timestampdiff(unit, start, end)`` and its spellings ``datediff``/``date_diff(unit,
    start, end)``, a BIGINT, of dates, timestamps and timestamps_ntz (Spark casts each to a
    TIMESTAMP: a date is its midnight in UTC, a TIMESTAMP_NTZ its wall clock in UTC). Spark
    computes ``ChronoUnit.between`` of the two wall clocks in UTC (``LocalDateTime.until``):

    * ``MICROSECOND MILLISECOND SECOND MINUTE HOUR DAY WEEK``: the exact difference cut toward
      zero to whole units (``-1 h 59 min`` is -1 HOUR); here the microseconds' difference
      (overflow-checked: Spark raises "long overflow" for MICROSECOND, and DuckDB too where a
      larger unit's would fit: Spark decides), cut by DuckDB's ``//`` (toward zero, as Java's);
    * ``MONTH QUARTER YEAR``: the end's date is moved one day toward the start where its time
      of day has not reached the start's, then the months between the dates are Java's
      ``(packed(end) - packed(start)) / 32`` with ``packed = (year * 12 + month - 1) * 32 +
      day`` (a month counts only once the day of the month is reached: January 31 to February
      29 is 0 months, not clamped), cut toward zero, then divided by 3 or 12, cut toward zero.

    A DuckDB infinite timestamp raises (``_epoch_micros``). Other units (``DAYOFYEAR``, and a
    quoted one, which Spark rejects: ``_mark_diff_units``) refuse; sqlglot wraps each argument
    of ``datediff`` in a date conversion of its own, which is taken off here (Spark does not
    convert them)."""
    _only(node, "this", "expression", "unit")
    if not node.meta.get(_BARE_UNIT):
        raise _Refuse("a unit not written as a bare word (_mark_diff_units)")
    end, start = node.this, node.expression
    if type(node) is exp.DateDiff:
        if type(end) is not exp.TsOrDsToDate or type(start) is not exp.TsOrDsToDate:
            raise _Refuse("datediff arguments")
        _only(end, "this")
        _only(start, "this")
        end, start = end.this, start.this
    unit = node.args.get("unit")
    name = unit.name.upper() if type(unit) is exp.Var else ""
    if name not in _DIFF_MICROS and name not in _DIFF_MONTHS:
        raise _Refuse("timestampdiff unit")
    s, e = _micros_of(start, columns), _micros_of(end, columns)
    if name in _DIFF_MICROS:
        return f"(subtract({e}, {s}) // {_DIFF_MICROS[name]})", BIGINT
    if max(len(s), len(e)) > _DIFF_OPERAND_CHARS:
        raise _Refuse("a calendar difference of long operands")
    day = _DIFF_MICROS["DAY"]

    def day_and_time(micros: str) -> tuple[str, str]:  # the day since 1970, the time of day
        time = f"((({micros}) % {day} + {day}) % {day})"
        return f"((({micros}) - {time}) // {day})", time

    def packed(days: str) -> str:
        date = f"(DATE '1970-01-01' + CAST({days} AS INTEGER))"
        return f"((year({date}) * 12 + month({date}) - 1) * 32 + day({date}))"

    (sd, st), (ed, et) = day_and_time(s), day_and_time(e)
    moved = (f"(CASE WHEN {ed} > {sd} AND {et} < {st} THEN {ed} - 1 "
             f"WHEN {ed} < {sd} AND {et} > {st} THEN {ed} + 1 ELSE {ed} END)")
    months = f"(({packed(moved)} - {packed(sd)}) // 32)"
    per = _DIFF_MONTHS[name]
    return (months if per == 1 else f"({months} // {per})"), BIGINT


def _add_months(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``add_months(d, n)`` of a date (or a timestamp's date in UTC, as Spark casts it) and an
    int (or NULL), a DATE: Spark's ``LocalDate.plusMonths`` keeps the day of the month or
    clamps it to the month's last day, as DuckDB's ``date + INTERVAL n MONTH`` does (a
    TIMESTAMP there, cast back), on the proleptic Gregorian calendar in both, years 0 and
    below (1 BC ...) and past 9999 included. Past DuckDB's timestamps (about 290000 years either
    way), where Spark still gives a date or raises, DuckDB raises; a DuckDB infinite date
    raises too: Spark decides."""
    _only(node, "this", "expression")
    d = _as_date(node.this, columns)
    n, _ = _typed(node.expression, columns, {INT, NULL})
    return (f"(CASE WHEN NOT isfinite({d}) THEN error('an infinite DuckDB date: Spark decides') "
            f"ELSE CAST({d} + to_months({n}) AS DATE) END)"), DATE


def _sqrt_sign(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``sqrt(x)`` and ``sign(x)``/``signum(x)`` of an int, a bigint, a double, a decimal
    literal or a decimal of at most 15 digits, each taken as a double as Spark casts it (the
    same double in DuckDB, ``_decimal_as_double``), a DOUBLE. ``sqrt`` is IEEE's correctly
    rounded square root in both (Java's ``Math.sqrt``, C's ``sqrt``; -0.0 is -0.0); a negative
    number (-inf too) is NaN in Spark, written out (older DuckDBs raise). ``signum`` is Java's
    ``Math.signum``: 1.0 or -1.0, and 0.0, -0.0 and NaN are themselves; DuckDB's ``sign`` is
    a TINYINT (0 for NaN), so it is written out."""
    _only(node, "this")
    a, typ = _translate(node.this, columns)
    if typ in (INT, BIGINT, DECIMAL_LIT):
        a = f"CAST({a} AS DOUBLE)"
    elif _decimal_of(typ) is not None:
        a, typ = _decimal_as_double(a, typ)
    elif typ != DOUBLE:
        raise _Refuse(f"operand type {typ}")
    if type(node) is exp.Sqrt:
        return f"(CASE WHEN {a} < 0 THEN CAST('NaN' AS DOUBLE) ELSE sqrt({a}) END)", DOUBLE
    return (f"(CASE WHEN {a} > 0 AND NOT isnan({a}) THEN CAST(1 AS DOUBLE) WHEN {a} < 0 THEN "
            f"CAST(-1 AS DOUBLE) ELSE {a} END)"), DOUBLE


def _make_date(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``make_date(year, month, day)`` of ints, a DATE (NULL if any is): a valid date of the
    proleptic Gregorian calendar in both (year 0 is 1 BC in both), and an invalid one (February
    30, month 13, day 0) raises in both (Spark's ANSI mode); past DuckDB's dates (about 5.8
    million years), DuckDB raises."""
    _only(node, "this", "expressions")
    if len(node.expressions) != 3:
        raise _Refuse("make_date arguments")
    parts = [_typed(a, columns, {INT})[0] for a in node.expressions]
    return f"make_date({', '.join(parts)})", DATE


def _initcap(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``initcap(s)`` of a string of ASCII characters: Spark lower-cases it and upper-cases the
    first character and each one after a space (U+0020 only: not after a tab, a hyphen or an
    apostrophe); here each piece between spaces, its first character upper-cased and the rest
    lower-cased. Beyond ASCII Spark maps case its own way (title case, full mappings): a string
    with another character raises (``error()``), Spark decides, as for ``upper``/``lower``."""
    _only(node, "this", "expression")
    delimiter = node.args.get("expression")  # sqlglot's default: a space (Spark takes no other)
    if delimiter is not None and not (type(delimiter) is exp.Literal and delimiter.is_string
                                      and delimiter.this == " "):
        raise _Refuse("initcap delimiter")
    a, _ = _typed(node.this, columns, {STRING})
    words = (f"list_transform(string_split({a}, ' '), lambda w: upper(substring(w, 1, 1)) || "
             f"lower(substring(w, 2)))")
    return (f"(CASE WHEN strlen({a}) <> length({a}) THEN error('not ASCII: Spark maps its "
            f"case') ELSE array_to_string({words}, ' ') END)"), STRING


#: the characters a ``split`` separator may not hold: Java's regular expression syntax
_REGEX_SYNTAX = frozenset("\\^$.|?*+()[]{}")


def _split_part(node: exp.Expression, columns: Columns) -> tuple[str, str]:
    """``split(s, 'sep')[i]`` (from 0) and ``element_at(split(s, 'sep'), i)`` (from 1, or from
    the end when negative) of a string, a separator literal of no regular-expression syntax
    (``_REGEX_SYNTAX``; then Java's ``String.split(sep, -1)`` is a plain split) and an integer
    literal index: DuckDB's ``string_split`` gives the same pieces (empty ones kept, at both
    ends too; '' is ['']). A NULL string gives NULL; an index past the pieces raises in Spark
    (ANSI), and in DuckDB (``error()``); ``[i]`` of a negative ``i`` and ``element_at`` of 0
    (Spark raises on every row), ``try_element_at`` and ``split``'s limit refuse."""
    _only(node, "this", "expressions", "offset", "safe")
    split = node.this
    if type(split) is not exp.RegexpSplit or node.args.get("safe") \
            or len(node.expressions) != 1:
        raise _Refuse("bracket form")
    _only(split, "this", "expression")
    sep = split.expression
    if type(sep) is not exp.Literal or not sep.is_string or not sep.this \
            or set(sep.this) & _REGEX_SYNTAX:
        raise _Refuse("split separator")
    k = _int_literal(node.expressions[0])
    base = node.args.get("offset") or 0
    if k is None or base not in (0, 1) or not _INT_MIN <= k <= _INT_MAX \
            or (base == 0 and k < 0) or (base == 1 and k == 0):
        raise _Refuse("split index")
    position = k + 1 if base == 0 else k  # DuckDB's lists count from 1, and from -1 at the end
    s, _ = _typed(split.this, columns, {STRING})
    parts = f"string_split({s}, {_literal(sep)[0]})"
    return (f"(CASE WHEN {s} IS NULL THEN NULL WHEN len({parts}) >= {abs(position)} THEN "
            f"{parts}[{position}] ELSE error('an index past the split: Spark decides') END)"
            ), STRING


#: the scales ``round`` is translated for (10**scale and 10**(scale+1) are exact doubles)
ROUND_SCALES = range(-15, 16)


def round_bound(scale: int) -> float:
    """The double below which ``_rounded``'s formula gives Spark's ``round(x, scale)``: the
    largest double under ``2**52 / 10**(scale+1)`` (a double's neighbours closer than a tenth of
    the scale's unit), and under 2**53 (past it Java prints a whole double's every digit, not
    the shortest: 5.63055581242145E16 as 5.6305558124214496E16). The pyarrow path
    (``arrow_expressions``) takes the same bound."""
    limit = (Fraction(2**52, 10 ** (scale + 1)) if scale >= 0
             else Fraction(min(2**52 * 10 ** (-scale - 1), 2**53)))
    bound = float(limit)
    return math.nextafter(bound, 0.0) if Fraction(bound) >= limit else bound


def _rounded(operand: exp.Expression, scale_node: exp.Expression | None, columns: Columns,
             half_even: bool) -> tuple[str, str]:
    """Spark's ``round``/``bround`` (``half_even``) of an int, a bigint, a double or a decimal to
    a literal scale (0 when omitted), of Spark's type and value.

    An integer to a scale >= 0 is itself. A decimal is DuckDB's ``round`` (half away from zero,
    as Spark's HALF_UP; ``bround`` refused) cast to Spark's type (``DecimalType.bounded(p - s +
    1 + min(s, scale), min(s, scale))``; refused where that passes 38 digits).

    A double: Spark rounds the decimal text ``Double.toString`` prints (``BigDecimal(d)
    .setScale(scale, mode).toDouble``), not the binary value: ``round(2.675, 2)`` is 2.68 although
    the double 2.675 is a little below it. Java 17's digits are not always the shortest, but they
    always read back as the same double, and where a double's neighbours are closer together than
    a tenth of the scale's unit (``|x| * 10**(scale+1) < 2**52``; and ``|x| < 2**53``, past which
    Java prints a whole double's every digit; else DuckDB raises and Spark decides that step),
    every text that reads back as ``x`` rounds alike, but where a halfway
    point ``h = (k + 1/2) / 10**scale`` reads back as ``x`` itself: then the shortest text, and
    Java's (it stops at the first digit whose candidate lies within half a unit in the last
    place), is ``h``, a tie. So with ``k = floor(|x| * 10**scale)`` (in doubles: off by one only
    next to an integer, where both sides round to it) and ``h`` as a double (``(10k + 5) /
    10**(scale+1)``, both exact, so correctly rounded): ``|x| > h`` rounds up, ``|x| < h``
    down, ``|x| = h`` is the tie (up, or to an even ``k``). The result ``±r / 10**scale`` is
    what Java's ``BigDecimal.doubleValue`` computes for an unscaled value under 2**52 (one
    division of exact doubles); zero is +0.0 (a ``BigDecimal`` has no negative zero); NaN and
    infinities are themselves. Checked bit for bit against Spark on ties, their neighbours and
    random bit patterns at scales -2 to 6, with the largest values each scale takes
    (``tests/driver/test_expressions``), and once on 20M values at scales -15 to 15."""
    scale = 0 if scale_node is None else _int_literal(scale_node)
    if scale is None or scale not in ROUND_SCALES:
        raise _Refuse("round scale")
    a, typ = _translate(operand, columns)
    decimal = _decimal_of(typ)
    if decimal is not None:
        precision, digits = decimal
        if half_even or scale < 0 or precision - digits + 1 + min(digits, scale) > 38:
            raise _Refuse("bround, a negative scale or a type past 38 digits of a decimal")
        out = _decimal_tag(precision - digits + 1 + min(digits, scale), min(digits, scale))
        return f"CAST(round({a}, {scale}) AS {out.upper()})", out
    if typ in (INT, BIGINT):
        if scale < 0:
            raise _Refuse("round of an integer to a negative scale")
        return a, typ
    if typ != DOUBLE:
        raise _Refuse(f"operand type {typ}")
    x = f"abs({a})"
    if scale >= 0:
        scaled = f"({x} * 1e{scale})"
        half = f"((floor({scaled}) * 10 + 5) / 1e{scale + 1})"
    else:
        scaled = f"({x} / 1e{-scale})"
        half = f"((floor({scaled}) * 10 + 5) * 1e{-scale - 1})"
    bound = round_bound(scale)
    if half_even:
        up = f"({x} > {half} OR ({x} = {half} AND floor({scaled}) % 2 = 1))"
    else:
        up = f"({x} >= {half})"
    r = f"(floor({scaled}) + CAST({up} AS DOUBLE))"
    signed = f"(sign({a}) * {r})"
    value = f"({signed} / 1e{scale})" if scale >= 0 else f"({signed} * 1e{-scale})"
    return (f"(CASE WHEN isnan({a}) OR isinf({a}) THEN {a} "
            f"WHEN {x} >= {bound!r} THEN error('round of a double this large: Spark decides') "
            f"WHEN {r} = 0 THEN 0.0 ELSE {value} END)"), DOUBLE


# --- literals ----------------------------------------------------------------------------------

_INT_RE = re.compile(r"\d+")
_DEC_RE = re.compile(r"(\d+\.\d*|\.\d+)")
_DBL_RE = re.compile(r"(\d+\.?\d*|\.\d+)[eE][+-]?\d+")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _is_number(node: exp.Expression) -> bool:
    return type(node) is exp.Literal and not node.is_string


def _int_literal(node: exp.Expression | None) -> int | None:
    if node is None:
        return None
    node = _unparen(node)
    negative = type(node) is exp.Neg
    inner = node.this if negative else node
    if type(inner) is exp.Literal and not inner.is_string and _INT_RE.fullmatch(str(inner.this)):
        value = int(inner.this)
        return -value if negative else value
    return None


def _is_literal(node: exp.Expression) -> bool:
    node = _unparen(node)
    t = type(node)
    return (t in (exp.Literal, exp.Boolean, exp.Null) or (t is exp.Neg and _is_number(node.this))
            or t in (exp.Cast, exp.TryCast) or _folded_date(node) is not None
            or _folded_decimal(node) is not None)


def _literal(node: exp.Expression) -> tuple[str, str]:
    t = type(node)
    if t is exp.Null:
        _only(node)
        return "NULL", NULL
    if t is exp.Boolean:
        _only(node, "this")
        return ("TRUE" if node.this is True else "FALSE"), BOOLEAN
    negative = t is exp.Neg
    if negative:
        _only(node, "this")
        node = node.this
    _only(node, "this", "is_string")
    text = str(node.this)
    if node.is_string:
        if negative:
            raise _Refuse("negated string")
        return exp.Literal.string(text).sql(dialect="duckdb"), STRING
    sign = "-" if negative else ""
    if _INT_RE.fullmatch(text):
        value = int(sign + text)
        if _INT_MIN <= value <= _INT_MAX:
            typ = INT  # Spark's literal grammar takes the minus sign: -2147483648 is an int
        elif _LONG_MIN <= value <= _LONG_MAX:
            typ = BIGINT
        else:
            raise _Refuse("integer literal beyond bigint (a decimal in Spark)")
        return (f"({value})" if value < 0 else str(value)), typ
    if _DEC_RE.fullmatch(text):
        d = Decimal(sign + text)
        digits, exponent = d.as_tuple().digits, d.as_tuple().exponent
        assert isinstance(exponent, int)  # a finite literal (the pattern has no NaN or Infinity)
        if len(digits) > 18 or -exponent > 18:
            raise _Refuse("long decimal literal")
        # Exact in both; both compare it with integers exactly and with doubles as a double.
        plain = format(d, "f")
        plain = plain if "." in plain else plain + ".0"  # keep it a DECIMAL for DuckDB
        typ = DECIMAL_LIT if len(digits) <= 15 and -exponent <= 15 else DECIMAL_WIDE
        return (f"({plain})" if negative else plain), typ
    if _DBL_RE.fullmatch(text):
        real = float(sign + text)
        if real in (float("inf"), float("-inf")) or (real == 0.0 and Decimal(text) != 0):
            raise _Refuse("double literal out of range")
        # repr round-trips exactly; the exponent keeps DuckDB from reading it as a DECIMAL.
        return f"({real!r}e0)" if "e" not in repr(real) else f"({real!r})", DOUBLE
    raise _Refuse(f"numeric literal {text!r}")


def _date_literal(node: exp.Expression) -> tuple[str, str]:
    """``DATE 'yyyy-mm-dd'`` and ``CAST('yyyy-mm-dd' AS DATE)`` (sqlglot: a CAST, or a TRY_CAST
    as it reads Spark's CAST, of a string to DATE; the same for a valid date) for a strictly ISO
    valid date."""
    day = _date_value(node)
    if day is None:
        raise _Refuse("CAST")
    return f"DATE '{day.isoformat()}'", DATE


def _date_value(node: exp.Expression) -> datetime.date | None:
    """The date of a date literal, or None if ``node`` is not one."""
    if type(node) not in (exp.Cast, exp.TryCast):
        return None
    if set(k for k, v in node.args.items() if v not in (None, False, [], "")) - {"this", "to",
                                                                                   "_type"}:
        return None
    to, value = node.args.get("to"), node.this
    if (type(to) is not exp.DataType or to.this != exp.DataType.Type.DATE
            or set(k for k, v in to.args.items() if v) - {"this", "nested"}
            or type(value) is not exp.Literal or not value.is_string):
        return None
    text = value.this
    if not _DATE_RE.fullmatch(text):
        return None
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        return None


# --- constant folding --------------------------------------------------------------------------

_INTERVAL_UNITS = {"DAY": "day", "DAYS": "day", "MONTH": "month", "MONTHS": "month",
                   "YEAR": "year", "YEARS": "year"}


def _folded_constant(node: exp.Expression) -> tuple[str, str] | None:
    """A constant computed here as Spark computes it, or None if ``node`` is not one of:

    * a date literal plus or minus an interval literal of whole days, months or years (Spark:
      ``date_add`` for days, ``add_months`` for months and years, which keeps the day of the
      month or clamps it to the month's last day: ``DATE '2024-01-31' + INTERVAL '1' MONTH``
      is ``2024-02-29``); DuckDB would give a TIMESTAMP. Nested ones fold inside out;
    * decimal literals added, subtracted or multiplied (``0.06 - 0.01``): Spark's decimal
      result is exact for them, so it is computed exactly and typed as a decimal literal.
    """
    day = _folded_date(node)
    if day is not None:
        return f"DATE '{day.isoformat()}'", DATE
    value = _folded_decimal(node)
    if value is None:
        return None
    digits, exponent = value.as_tuple().digits, value.as_tuple().exponent
    assert isinstance(exponent, int)
    if len(digits) > 15 or -exponent > 15:
        raise _Refuse("long folded decimal")
    plain = format(value, "f")
    plain = plain if "." in plain else plain + ".0"
    return (f"({plain})" if value < 0 else plain), DECIMAL_LIT


def _folded_date(node: exp.Expression) -> datetime.date | None:
    node = _unparen(node)
    literal = _date_value(node)
    if literal is not None:
        return literal
    t = type(node)
    if t not in (exp.Add, exp.Sub) or set(k for k, v in node.args.items() if v) - {
            "this", "expression"}:
        return None
    left, right = _unparen(node.this), _unparen(node.expression)
    if t is exp.Add and type(left) is exp.Interval:
        left, right = right, left  # INTERVAL ... + DATE ...
    if type(right) is not exp.Interval:
        return None
    base = _folded_date(left)
    amount = _interval(right)
    if base is None or amount is None:
        return None
    n, unit = amount
    if t is exp.Sub:
        n = -n
    try:
        if unit == "day":
            return base + datetime.timedelta(days=n)
        months = base.year * 12 + base.month - 1 + (n if unit == "month" else 12 * n)
        year, month = divmod(months, 12)
        last = calendar.monthrange(year, month + 1)[1]
        return datetime.date(year, month + 1, min(base.day, last))
    except (ValueError, OverflowError):  # past year 9999 or before year 1
        raise _Refuse("date out of range") from None


def _interval(node: exp.Interval) -> tuple[int, str] | None:
    """``INTERVAL '3' MONTH`` (or ``INTERVAL 3 MONTH``): (3, "month")."""
    if set(k for k, v in node.args.items() if v) - {"this", "unit"}:
        return None
    unit, value = node.args.get("unit"), node.this
    if type(unit) is not exp.Var or unit.name.upper() not in _INTERVAL_UNITS:
        return None
    if type(value) is not exp.Literal or not _INT_RE.fullmatch(str(value.this)):
        return None
    n = int(value.this)
    return (n, _INTERVAL_UNITS[unit.name.upper()]) if n <= 1_000_000 else None


def _folded_decimal(node: exp.Expression) -> Decimal | None:
    """The exact value of decimal literals joined by ``+ - *`` (at least one with a point),
    when Spark computes it exactly: every intermediate's decimal type (Spark's rules: a
    product has p1 + p2 + 1 digits and s1 + s2 after the point, a sum max(s1, s2) after the
    point and one more digit before it) within 38 digits, past which Spark rounds."""
    typed = _folded_decimal_typed(node)
    return None if typed is None else typed[0]


#: (value, is a decimal (not an integer), precision, scale) of a literal or a fold
_TypedDecimal: TypeAlias = tuple[Decimal, bool, int, int]


def _folded_decimal_typed(node: exp.Expression) -> _TypedDecimal | None:
    node = _unparen(node)
    t = type(node)
    if t not in (exp.Add, exp.Sub, exp.Mul):
        return None
    if set(k for k, v in node.args.items() if v) - {"this", "expression"}:
        return None
    a, b = _decimal_value(node.this), _decimal_value(node.expression)
    if a is None or b is None:
        return None
    if not (a[1] or b[1]):
        return None  # integers: Spark's integer arithmetic (and its overflow) applies
    (x, _, p1, s1), (y, _, p2, s2) = a, b
    if t is exp.Mul:
        precision, scale = p1 + p2 + 1, s1 + s2
    else:
        scale = max(s1, s2)
        precision = max(p1 - s1, p2 - s2) + scale + 1
    if precision > 38:
        raise _Refuse("a decimal constant Spark would round")
    with localcontext(Context(prec=100)):
        result = x + y if t is exp.Add else x - y if t is exp.Sub else x * y
    return result, True, precision, scale


def _decimal_value(node: exp.Expression) -> _TypedDecimal | None:
    """A plain decimal or integer literal, or a fold, with its Spark decimal type (a literal's:
    its digits, at least its scale)."""
    node = _unparen(node)
    negative = type(node) is exp.Neg
    inner = _unparen(node.this) if negative else node
    if type(inner) is exp.Literal and not inner.is_string:
        text = str(inner.this)
        if _DEC_RE.fullmatch(text) or _INT_RE.fullmatch(text):
            value = Decimal(text)
            digits, exponent = value.as_tuple().digits, value.as_tuple().exponent
            assert isinstance(exponent, int)
            scale = max(0, -exponent)
            precision = max(len(digits), scale)
            if precision > 38:
                return None
            return (-value if negative else value), "." in text, precision, scale
        return None
    if negative:
        return None
    return _folded_decimal_typed(node)
