"""One query (SELECT, set operations, CTEs, subqueries) compiled onto a circuit's operators.

The query is read as sqlglot parsed it (Spark dialect) and built from ``Collection.select``,
``filter``, ``union``, ``distinct``, ``join``, ``left_join``, ``semijoin``, ``antijoin`` and
``group_by().agg()``. Expressions are not interpreted here: each one is rendered back to Spark SQL
text (``.sql(dialect="spark")``) with its column references renamed, so it means what Spark says
it means, on both engine paths.

How a SELECT becomes operators:

* every table of the FROM clause gets internal column names unique within the SELECT (a column
  keeps its name unless another table has it too);
* WHERE and inner-join ON conditions are split into conjuncts. A conjunct on one table filters
  that table first; an equality between the tables joined so far and a new table is a join key
  (keys may be expressions: they are computed as columns first); the rest filter after the joins.
  Tables are joined in FROM order, each with the first table it has a join key with; two tables
  with no equality between them would be a cross join, which is refused;
* ``LEFT JOIN ... ON`` takes equalities between the two sides as keys, and conditions on its right
  side alone as a filter of the right side. ``RIGHT JOIN`` and ``FULL JOIN`` likewise take
  equalities as keys (a RIGHT JOIN's conditions on its left side alone filter it first). Any
  other ON condition (on the preserved side, or between the sides) decides with the keys which
  rows match: the inner join is filtered by it, and the preserved side's rows in none of its
  rows are padded (``_unmatched``). A WHERE conjunct on a source an outer join pads with NULLs
  applies after that join. NULL keys never match (SQL equality), in inner and outer joins alike;
* ``x IN (SELECT y ...)``, ``EXISTS (...)`` and ``NOT EXISTS (...)`` as conjuncts of WHERE become
  semi- and anti-joins; a correlated subquery refers to the outer query in equalities of its
  WHERE clause (they become join keys), and an EXISTS / NOT EXISTS also in other conditions (the
  outer values with a matching inner row, joined on the equalities and filtered, are the keys:
  ``_residual_matches``). ``NOT IN`` is compiled only when both sides are
  declared NOT NULL (otherwise SQL's NULL rules make it differ from an anti-join);
* ``x < (SELECT avg(y) FROM ... WHERE inner.k = outer.k)`` (any comparison, a correlated scalar
  subquery whose value is sum/avg/min/max with arithmetic) becomes a join with the subquery
  grouped by its correlated columns, then a filter; a scalar subquery that is not correlated
  (in WHERE or HAVING) is a global aggregate, one row always, joined on a constant key;
* a conjunct every branch of an OR in WHERE has is taken out of the OR (``(a AND b) OR (a AND
  c)`` is ``a AND (b OR c)``), so a join key written in each branch is a join key;
* GROUP BY projects its key expressions and the aggregates' argument expressions first, then
  aggregates (``count(*)``, ``count``, ``sum``, ``avg``, ``min``, ``max``), then HAVING filters
  and the SELECT list is computed over keys and aggregates; without GROUP BY the aggregates are
  global (``Collection.agg``: one row, also over no rows). ``count/sum/avg(DISTINCT x)``: per
  argument, a ``distinct`` of (keys, x) unioned with the rows before grouping, in a column of
  its own (``_with_distinct_values``);
* ``UNION ALL`` is the Z-set sum, ``UNION`` its ``distinct``. ``INTERSECT`` and ``EXCEPT`` (the
  set forms) count, per distinct row, on which sides it occurs (a grouping, so NULLs compare
  equal as SQL's set operations say). ``INTERSECT ALL`` and ``EXCEPT ALL`` count its
  occurrences on each side, m and n, and ``repeat`` the row ``min(m, n)`` or ``m - n`` times
  (not ``minus``: it would give ``m - n`` where ``n > m`` too, a negative multiplicity).

* ``ORDER BY ... LIMIT k`` of a SELECT is ``top_k`` over its result, ordered by its columns;
  ``ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rn`` (or ``RANK()``, ``DENSE_RANK()``) is
  ``top_k`` per partition with a rank column, as many places as the enclosing query's
  ``WHERE rn <= k`` keeps (``_ranked``).

What needs operators the circuit does not have is refused with a ``SqlError``: ORDER BY without
LIMIT, window functions other than ROW_NUMBER, RANK and DENSE_RANK (also in QUALIFY).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlglot import exp

from dbsp_pipeline.circuit import Collection, fresh_name
from dbsp_pipeline.column_types import known_columns
from dbsp_pipeline.sql.catalog import EVERY_PLACE, Catalog, Ranking, Relation
from dbsp_pipeline.sql.errors import SqlError
from dbsp_pipeline.zset import quote

#: aggregate node classes of sqlglot and the circuit's aggregate function each compiles to
AGGREGATES: dict[type[exp.Expr], str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}

Ctes = dict[str, Relation]

#: the column of a scalar subquery's value (``QueryCompiler._scalar_subquery``)
SCALAR_VALUE = "scalar_value"


def right_keys(n: int) -> list[str]:
    """The key columns of a scalar subquery's value: the correlated columns, or one constant
    column when it is not correlated."""
    return [f"key_{i}" for i in range(n)]

_COMPARISONS: dict[type[exp.Expr], str] = {
    exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}
#: the nodes of a scalar subquery's value that keep it NULL when no row matches
_NULL_ON_EMPTY = (exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Literal, exp.Add, exp.Sub, exp.Mul,
                  exp.Div, exp.Paren, exp.Neg, exp.Identifier)


class Namer:
    """Column names unique within one SELECT (case-insensitively, as Spark resolves them)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name.lower() in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name.lower())
        return name


@dataclass
class Source:
    """A relation of a FROM clause: its qualifier, its collection (internal column names) and
    its user-visible columns, each bound to an internal column."""

    qualifier: str
    collection: Collection
    names: list[str]
    bindings: dict[str, str]  # lower-cased user column name -> internal column name
    null_supplied: bool = False  # padded with NULLs by an outer join
    supplied_by: int | None = None  # the index of that join (the last, if several)
    not_null: frozenset[str] = frozenset()
    node: exp.Expr | None = None  # where it is named in the SQL
    #: the right side of a [LEFT] SEMI or ANTI JOIN: its columns are not in the result, so
    #: only that join's ON clause may name them
    hidden: bool = False

    def never_null(self, column: str) -> bool:
        """Whether ``column`` (lower-cased) never holds NULL here: declared NOT NULL, and the
        source is not padded with NULLs by an outer join."""
        return not self.null_supplied and column in self.not_null


@dataclass
class Scope:
    """The tables of one SELECT's FROM clause, and the enclosing query's (for correlation)."""

    sources: list[Source]
    namer: Namer
    outer: Scope | None = None
    collection: Collection | None = None  # every source joined (after from_where)
    columns: list[str] = field(default_factory=list)
    ctes: Ctes = field(default_factory=dict)  # the CTEs the SELECT may read
    #: WHERE conjuncts of a subquery that refer to the enclosing query other than as an
    #: equality (``inner.s <> outer.s``); only EXISTS / NOT EXISTS compile them
    residuals: list[exp.Expr] = field(default_factory=list)
    #: what ``*`` expands to when a join has USING (``QueryCompiler._expand_using``)
    star: list[tuple[str, exp.Expr]] | None = None


@dataclass(frozen=True)
class Correlation:
    """``outer = inner``: an equality of a subquery's WHERE between the enclosing query's
    columns and the subquery's."""

    outer: exp.Expr
    inner: exp.Expr


@dataclass
class Conjunct:
    node: exp.Expr
    sources: frozenset[int]
    #: of WHERE (applies after every join, outer ones too), not of an inner join's ON
    where: bool = True

    def ready(self, members: set[int], scope: Scope) -> bool:
        """Whether it may apply to the join of ``members``: a WHERE conjunct on a source an
        outer join pads with NULLs waits for that join."""
        return not self.where or all(scope.sources[i].supplied_by in (None, *members)
                                     for i in self.sources)


@dataclass(frozen=True)
class OuterKeys:
    """An outer join's ON clause: its key pairs (joined tables' expression, right side's), the
    conditions that filter the joined tables before a RIGHT JOIN, and the rest (``residuals``:
    on the preserved side, or between the sides other than as equal keys), which decide with
    the keys whether two rows match."""

    pairs: list[tuple[exp.Expr, exp.Expr]]
    left_filters: list[exp.Expr]
    residuals: list[exp.Expr]


@dataclass
class Joined:
    collection: Collection
    columns: list[str]
    members: set[int]


class QueryCompiler:
    """Compiles the queries of one view (``view`` names it in errors) against ``catalog``."""

    def __init__(self, view: str, catalog: Catalog) -> None:
        self.view = view
        self.catalog = catalog

    def error(self, node: exp.Expr | None, problem: str, hint: str = "") -> SqlError:
        return SqlError(self.view, node, problem, hint)

    def refuse_unsupported(self, query: exp.Expr) -> None:
        """Refuse the constructs no view may hold, wherever in ``query`` they are: a PIVOT or
        a LATERAL VIEW belongs to a table or subquery in FROM, no SELECT's clause, so the
        clauses ``_refuse_modifiers`` looks at do not show it."""
        for pivot in query.find_all(exp.Pivot):
            if pivot.args.get("unpivot"):
                raise self.error(pivot, "UNPIVOT is not supported",
                                 "write it as a UNION ALL of one SELECT per column")
            raise self.error(pivot, "PIVOT is not supported",
                             "write each pivoted column as a conditional aggregate, e.g. "
                             "count(CASE WHEN region = 'north' THEN 1 END) AS north, grouped "
                             "by the other columns")
        for filtered in query.find_all(exp.Filter):
            raise self.error(filtered, "an aggregate's FILTER (WHERE ...) is not supported",
                             "aggregate a CASE instead: count(CASE WHEN v > 0 THEN 1 END), "
                             "sum(CASE WHEN v > 0 THEN v END)")
        for lateral in query.find_all(exp.Lateral):
            raise self.error(lateral, "LATERAL VIEW and LATERAL subqueries are not supported",
                             "push one input row per element of an array instead of "
                             "exploding it in the view")
        for grouping in query.find_all(exp.Rollup, exp.Cube, exp.GroupingSets):
            # (``GROUP BY ROLLUP(a)`` and ``GROUP BY a WITH ROLLUP`` alike)
            raise self.error(grouping, "ROLLUP, CUBE and GROUPING SETS are not supported",
                             "declare one view per grouping")

    # -- queries ---------------------------------------------------------------------------
    def relation(self, q: exp.Expr, ctes: Ctes, unnamed: bool = False) -> Relation:
        """The relation query ``q`` computes. ``unnamed``: its column names do not matter (the
        right side of a set operation, an IN subquery), so computed columns need no AS."""
        if isinstance(q, exp.Subquery):
            self._refuse_modifiers(q)
            return self.relation(q.this, ctes, unnamed)
        ctes = self._with_ctes(q, ctes)
        if isinstance(q, exp.SetOperation):
            return self._set_operation(q, ctes, unnamed)
        if isinstance(q, exp.Select):
            if q.args.get("qualify") is not None:
                return self._qualify(q, ctes, unnamed)
            nested = _number_after_grouping(q)
            if nested is not None:
                return self.relation(nested, ctes, unnamed)
            self._refuse_modifiers(q, top_k=True)
            scope, correlations = self._from_where(q, ctes, None)
            assert not correlations  # no outer scope to correlate with
            relation = self._project(q, scope, unnamed)
            return self._top_k(q, relation) if q.args.get("limit") else relation
        raise self.error(q, f"{type(q).__name__} is not a query",
                         "a view is one SELECT (with UNION/INTERSECT/EXCEPT, WITH, subqueries)")

    def _qualify(self, q: exp.Select, ctes: Ctes, unnamed: bool) -> Relation:
        """``SELECT ... QUALIFY condition`` as SQL evaluates it: the SELECT without it in a
        subquery, filtered by the condition in the enclosing query (which may name the SELECT's
        columns, a numbering column among them, and keeps ORDER BY ... LIMIT). A window function
        written in the condition (``QUALIFY ROW_NUMBER() OVER (...) <= 3``) becomes a column of
        the subquery, dropped from the result; its bound makes the numbering a top-k."""
        condition = q.args["qualify"].this
        windows = list(condition.find_all(exp.Window))
        if len(windows) > 1:
            raise self.error(windows[1], "one window function per QUALIFY is supported",
                             "number the rows in a column of the SELECT and name it in QUALIFY")
        taken = [e.alias_or_name for e in q.expressions]
        helper = fresh_name("qualify_rank", taken) if windows else None
        inner = q.copy()
        copy_meta(q, inner)
        for arg in ("qualify", "with_", "order", "limit", "offset"):
            inner.set(arg, None)  # the CTEs are in scope already; ORDER BY ... LIMIT is outside
        if windows:
            window = windows[0].copy()
            copy_meta(windows[0], window)
            inner.set("expressions", [*inner.expressions,
                                      exp.alias_(window, helper, quoted=True)])
        qualified = _rewrite(condition, lambda n: exp.column(helper or "", quoted=True)
                             if isinstance(n, exp.Window) else None)
        alias = exp.TableAlias(this=exp.to_identifier(fresh_name("qualified", taken)))
        outer = exp.Select(expressions=[exp.Star()]).from_(
            exp.Subquery(this=inner, alias=alias)).where(qualified)
        for arg in ("order", "limit", "offset"):
            if q.args.get(arg) is not None:
                outer.set(arg, q.args[arg].copy())
        relation = self.relation(outer, ctes, unnamed)
        if helper is None:
            return relation
        columns = tuple(c for c in relation.columns if c != helper)
        return Relation(relation.collection.select(*[quote(c) for c in columns]), columns,
                        relation.not_null - {helper.lower()})

    def _with_ctes(self, q: exp.Expr, ctes: Ctes) -> Ctes:
        with_ = q.args.get("with_")
        if not with_:
            return ctes
        if with_.args.get("recursive"):
            raise self.error(with_, "WITH RECURSIVE is not supported",
                             "recursive queries need a fixed-point operator the circuit lacks")
        scoped = dict(ctes)
        for cte in with_.expressions:
            relation = self.relation(cte.this, scoped)
            relation = self._rename_columns(cte, relation, cte.args.get("alias"))
            scoped[cte.alias.lower()] = relation
        return scoped

    def _top_k(self, q: exp.Select, relation: Relation) -> Relation:
        """``ORDER BY ... LIMIT k`` of a SELECT: ``top_k`` over its result. The ORDER BY keys
        must be columns of the result (by name or position); rows that tie on them are ordered
        by all their columns, so the view does not depend on the order input arrived in."""
        limit = q.args["limit"]
        value = limit.expression
        if not (isinstance(value, exp.Literal) and not value.is_string
                and value.this.isdigit() and int(value.this) > 0):
            raise self.error(limit, "LIMIT takes a positive integer literal")
        order = q.args.get("order")
        if order is None:
            raise self.error(limit, "LIMIT without ORDER BY is not supported",
                             "it picks arbitrary rows; add ORDER BY to say which")
        by_name = {c.lower(): c for c in relation.columns}
        # a qualified ORDER BY column (``b.k``) is the result's column ``k`` unless the SELECT
        # list computes ``k`` otherwise: from another table's column, an expression, or a
        # USING key merged from both sides (``*`` lists each table's columns as they are)
        explicit = {x.alias_or_name.lower(): x.unalias() for x in q.expressions
                    if not isinstance(x, exp.Star) and not (isinstance(x, exp.Column)
                                                            and isinstance(x.this, exp.Star))}
        keys = []
        for item in order.expressions:
            e = item.this
            if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit() \
                    and 1 <= int(e.this) <= len(relation.columns):
                column = relation.columns[int(e.this) - 1]
            elif isinstance(e, exp.Column) and e.table:
                chosen = explicit.get(e.name.lower())
                if e.name.lower() not in by_name or (chosen is not None and not (
                        isinstance(chosen, exp.Column) and chosen.name.lower() == e.name.lower()
                        and chosen.table.lower() in ("", e.table.lower()))):
                    raise self.error(item, f"ORDER BY {e.sql(dialect='spark')} of a top-k names "
                                     "no column of the view", "select that column (with AS "
                                     "name if another has its name) and order by its name")
                column = by_name[e.name.lower()]
            elif isinstance(e, exp.Column) and e.name.lower() in by_name:
                column = by_name[e.name.lower()]
            else:
                raise self.error(item, "ORDER BY of a top-k orders by the view's columns only",
                                 "add the expression to the SELECT list with AS name and order "
                                 "by that name")
            nulls = item.args.get("nulls_first")
            keys.append(f"{quote(column)} {'DESC' if item.args.get('desc') else 'ASC'}"
                        + ("" if nulls is None else
                           f" NULLS {'FIRST' if nulls else 'LAST'}"))
        return Relation(relation.collection.top_k(int(value.this), keys), relation.columns,
                        relation.not_null)

    def _refuse_modifiers(self, q: exp.Expr, top_k: bool = False) -> None:
        """Refuse the clauses a view cannot have; with ``top_k``, ORDER BY with LIMIT is
        allowed (``_top_k`` compiles it)."""
        allowed = ("order", "limit") if top_k and q.args.get("limit") else ()
        for arg, what in (("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET"),
                          ("qualify", "QUALIFY"), ("laterals", "LATERAL VIEW"),
                          ("pivots", "PIVOT"), ("windows", "WINDOW")):
            value = q.args.get(arg)
            if value and arg == "qualify":  # ``relation`` compiles a SELECT's; not here
                raise self.error(value, "QUALIFY in an IN, EXISTS or scalar subquery is not "
                                 "supported", "number and filter the rows in a subquery in "
                                 "FROM or a CTE, and read that")
            if value and arg not in allowed:
                node = value[0] if isinstance(value, list) else value
                raise self.error(node, f"{what} is not supported in a view",
                                 "a view is an unordered multiset: drop the clause and order "
                                 "when reading the view; ORDER BY with LIMIT (a top-k) compiles "
                                 "on a SELECT's result")

    def _set_operation(self, q: exp.SetOperation, ctes: Ctes, unnamed: bool) -> Relation:
        self._refuse_modifiers(q)
        left = self.relation(q.this, ctes, unnamed)
        right = self.relation(q.expression, ctes, unnamed=True)
        if len(left.columns) != len(right.columns):
            raise self.error(q, f"the two sides of {q.key.upper()} have {len(left.columns)} and "
                             f"{len(right.columns)} columns", "select the same number of columns")
        columns = list(left.columns)
        right_c = right.collection
        if [c.lower() for c in right.columns] != [c.lower() for c in columns]:
            right_c = right_c.select(*[f"{quote(r)} AS {quote(c)}"
                                       for r, c in zip(right.columns, columns)])
        distinct = bool(q.args.get("distinct"))
        if isinstance(q, exp.Union):
            union = left.collection.union(right_c)
            return Relation(union.distinct() if distinct else union, tuple(columns))
        what = "INTERSECT" if isinstance(q, exp.Intersect) else "EXCEPT"
        cols = [quote(c) for c in columns]
        if not distinct:
            # per distinct row, m occurrences on the left and n on the right: INTERSECT ALL
            # keeps min(m, n) of them, EXCEPT ALL max(m - n, 0) (``repeat`` drops the rest)
            m, n = fresh_name("left_rows", columns), fresh_name("right_rows", columns)
            keep = fresh_name("kept", columns + [m, n])
            sides = left.collection.select(*cols, f"1 AS {quote(m)}", f"0 AS {quote(n)}").union(
                right_c.select(*cols, f"0 AS {quote(m)}", f"1 AS {quote(n)}"))
            counted = sides.group_by(*columns).agg(
                **{m: f"sum({quote(m)})", n: f"sum({quote(n)})"})
            kept = (f"least({quote(m)}, {quote(n)})" if what == "INTERSECT"
                    else f"{quote(m)} - {quote(n)}")
            return Relation(counted.select(*cols, f"{kept} AS {quote(keep)}").repeat(keep),
                            tuple(columns))
        # each distinct row tagged 1 (left) or 2 (right); the sum of tags says where it occurs
        tag = fresh_name("side", columns)
        tags = fresh_name("sides", columns)
        tagged = left.collection.distinct().select(*cols, f"1 AS {quote(tag)}").union(
            right_c.distinct().select(*cols, f"2 AS {quote(tag)}"))
        counted = tagged.group_by(*columns).agg(**{tags: f"sum({quote(tag)})"})
        keep = f"{quote(tags)} = 3" if what == "INTERSECT" else f"{quote(tags)} = 1"
        return Relation(counted.filter(keep).select(*cols), tuple(columns))

    def _rename_columns(self, node: exp.Expr, relation: Relation,
                        alias: exp.Expr | None) -> Relation:
        """``name(c1, c2)`` (a CTE's or a FROM alias's column list) renames the columns."""
        names = [c.name for c in alias.args.get("columns") or []] if alias else []
        if not names:
            return relation
        if len(names) != len(relation.columns):
            raise self.error(node, f"{len(names)} column names given for "
                             f"{len(relation.columns)} columns")
        renamed = relation.collection.select(
            *[f"{quote(o)} AS {quote(n)}" for o, n in zip(relation.columns, names)])
        return Relation(renamed, tuple(names))

    # -- FROM and WHERE --------------------------------------------------------------------
    def _from_item(self, item: exp.Expr, ctes: Ctes) -> tuple[Relation, str]:
        """FROM item ``item``'s relation (its columns renamed by an alias list) and
        qualifier."""
        if isinstance(item, exp.Table):
            if item.args.get("db") or item.args.get("catalog"):
                raise self.error(item, f"qualified table name '{item.sql(dialect='spark')}'",
                                 "name a table or view of this circuit without a database")
            name = item.name
            relation = ctes.get(name.lower()) or self.catalog.lookup(name)
            if relation is None:
                known = sorted(set(ctes) | set(self.catalog.relations))
                raise self.error(item, f"unknown table or view '{name}'",
                                 f"declare it first (CREATE TABLE / CREATE VIEW); known: {known}")
            qualifier = item.alias_or_name
        elif isinstance(item, exp.Subquery):
            relation = self.relation(item.this, ctes)
            qualifier = item.alias
        else:
            raise self.error(item, f"{type(item).__name__} in FROM is not supported",
                             "FROM takes tables, views, CTEs and subqueries")
        return self._rename_columns(item, relation, item.args.get("alias")), qualifier.lower()

    def _source(self, item: exp.Expr, relation: Relation, qualifier: str, namer: Namer,
                places: int | None) -> Source:
        """FROM item ``item`` as a source of the SELECT, its columns named by ``namer``; a
        ranked relation keeps ``places`` places (``_rank_bound``)."""
        bindings = {c.lower(): namer.fresh(c) for c in relation.columns}
        collection = (relation.bounded(places) if places is not None
                      else relation.collection)
        if any(bindings[c.lower()] != c for c in relation.columns):
            collection = collection.select(
                *[f"{quote(c)} AS {quote(bindings[c.lower()])}" for c in relation.columns])
        return Source(qualifier, collection, list(relation.columns), bindings,
                      not_null=relation.not_null, node=item)

    def _from_where(self, q: exp.Select, ctes: Ctes, outer: Scope | None
                    ) -> tuple[Scope, list[Correlation]]:
        """The FROM clause joined and filtered by WHERE: the scope with its ``collection``, and
        the equalities with the enclosing query (``outer``) the WHERE clause holds."""
        from_ = q.args.get("from_")
        if from_ is None:
            raise self.error(q, "SELECT without FROM is not supported",
                             "a view reads at least one table or view")
        namer = Namer()
        joins: list[exp.Join] = list(q.args.get("joins") or [])
        items: list[tuple[exp.Expr, exp.Join | None]] = [(from_.this, None)]
        items += [(j.this, j) for j in joins]
        scope = Scope([], namer, outer, ctes=ctes)
        kinds = [self._join_kind(join) for _, join in items]
        relations = [self._from_item(item, ctes) for item, _ in items]
        if any(join is not None and join.args.get("using") for _, join in items):
            scope.star = self._expand_using(q, items, relations, kinds)
        where = q.args.get("where")
        conjuncts = _where_conjuncts(where.this if where else None)
        for i, ((item, _), (relation, qualifier), kind) in enumerate(
                zip(items, relations, kinds)):
            places = (self._rank_bound(i, relations, kinds, conjuncts)
                      if relation.ranking is not None else None)
            source = self._source(item, relation, qualifier, namer, places)
            source.hidden = kind in ("semi", "anti")
            scope.sources.append(source)
        self._mark_null_supplied(items, kinds, scope)

        correlations: list[Correlation] = []
        pool: list[Conjunct] = []
        predicates: list[exp.Expr] = []  # subquery predicates, applied after the joins
        for node in conjuncts:
            self._classify(node, scope, pool, predicates, correlations)
        left_keys: dict[int, OuterKeys] = {}
        for i, ((_, join), kind) in enumerate(zip(items, kinds)):
            on = join.args.get("on") if join is not None else None
            if kind == "inner":
                for node in _conjuncts(on):
                    if _has_subquery(node):
                        raise self.error(node, "a subquery in JOIN ... ON is not supported",
                                         "move it to WHERE")
                    self._classify(node, scope, pool, predicates, correlations, where=False)
            else:
                if on is None:
                    raise self.error(join, f"{kind.upper()} JOIN needs an ON condition")
                source = scope.sources[i]
                source.hidden = False  # its ON clause reads it
                left_keys[i] = self._outer_join_keys(on, scope, i, kind)
                source.hidden = kind in ("semi", "anti")

        # conjuncts on one table (not the right side of a LEFT JOIN) filter it first
        for c in list(pool):
            if len(c.sources) == 1:
                (i,) = c.sources
                source = scope.sources[i]
                if not source.null_supplied or not c.where:
                    source.collection = source.collection.filter(self._render(c.node, scope))
                    pool.remove(c)

        state: Joined | None = None
        pending: list[int] = []
        for i, kind in enumerate(kinds):
            if kind == "inner":
                pending.append(i)
                continue
            state = self._join_pending(state, pending, pool, scope)
            pending = []
            assert state is not None
            if kind in ("semi", "anti"):
                state = self._semi_join(state, i, left_keys[i], scope, kind)
            else:
                state = self._outer_join(state, i, left_keys[i], scope, kind)
            state = self._apply_covered(state, pool, scope)
        state = self._join_pending(state, pending, pool, scope)
        assert state is not None
        collection = state.collection
        rest = [c.node for c in pool]
        if rest:
            collection = collection.filter(" AND ".join(
                f"({self._render(n, scope)})" for n in rest))
        scope.collection, scope.columns = collection, state.columns
        for node in predicates:
            self._apply_subquery_predicate(node, scope, ctes)
        return scope, correlations

    def _expand_using(self, q: exp.Select, items: list[tuple[exp.Expr, exp.Join | None]],
                      relations: list[tuple[Relation, str]], kinds: list[str]
                      ) -> list[tuple[str, exp.Expr]]:
        """``JOIN ... USING (k, ...)`` as Spark reads it, rewritten in ``q`` (in place): the
        join's condition becomes ``ON left.k = right.k``, where ``left.k`` is the one earlier
        FROM item with a column ``k`` (or the column an earlier USING merged); an unqualified
        ``k`` of the SELECT list, WHERE, GROUP BY, HAVING and later ON conditions names the
        merged column: the left side's for an inner, LEFT, SEMI or ANTI join, the right side's
        for a RIGHT join, ``coalesce(left.k, right.k)`` for a FULL join. Qualified references
        (``a.k``) keep naming their table's column. Returns what ``*`` expands to: as Spark
        orders it, each USING join's keys first, then the left side's other columns, then the
        right side's (none for SEMI and ANTI joins)."""
        merged: dict[str, exp.Expr] = {}
        spelled: dict[str, str] = {}  # a merged key's name as the left side spells it
        star: list[tuple[str, exp.Expr]] = []

        def columns_of(i: int) -> list[tuple[str, exp.Expr]]:
            relation, qualifier = relations[i]
            if not qualifier:
                raise self.error(items[i][0], "a subquery joined with USING needs an alias",
                                 "add AS name after the subquery")
            return [(c, exp.column(c, table=qualifier, quoted=True)) for c in relation.columns]

        def resolve(node: exp.Expr) -> exp.Expr | None:
            if isinstance(node, exp.Column) and not node.table \
                    and not isinstance(node.this, exp.Star) and node.name.lower() in merged:
                return merged[node.name.lower()].copy()
            if _is_query(node):
                return node  # a subquery's columns are its own
            return None

        star = columns_of(0)
        for i, ((_, join), kind) in enumerate(zip(items, kinds)):
            if join is None:
                continue
            using = join.args.get("using") or []
            if not using:
                if join.args.get("on") is not None:
                    join.set("on", _rewrite(join.args["on"], resolve))
                if kind not in ("semi", "anti"):
                    star += columns_of(i)
                continue
            right = {c.lower(): e for c, e in columns_of(i)}
            pairs, keys = [], []
            for u in using:
                name = u.name
                lower = name.lower()
                if lower in merged:
                    left = merged[lower].copy()
                else:
                    having = [j for j in range(i) if kinds[j] not in ("semi", "anti")
                              and lower in (c.lower() for c in relations[j][0].columns)]
                    if len(having) != 1:
                        raise self.error(u, f"USING column '{name}' is in "
                                         f"{'no table' if not having else 'several tables'} "
                                         "on the left of the join",
                                         "write the condition as ON a.k = b.k")
                    spelled[lower], left = next(
                        (c, e) for c, e in columns_of(having[0]) if c.lower() == lower)
                if lower not in right:
                    raise self.error(u, f"USING column '{name}' is not a column of "
                                     f"'{relations[i][1]}'", "write the condition as ON a.k = b.k")
                pairs.append(exp.EQ(this=left.copy(), expression=right[lower].copy()))
                merged[lower] = {"right": right[lower].copy(),
                                 "full": exp.func("coalesce", left.copy(), right[lower].copy())
                                 }.get(kind, left.copy())
                keys.append(lower)
            join.set("using", None)
            join.set("on", exp.and_(*pairs))
            right_rest = ([] if kind in ("semi", "anti") else
                          [(n, e) for n, e in columns_of(i) if n.lower() not in keys])
            star = ([(spelled[n], merged[n]) for n in keys]
                    + [(n, e) for n, e in star if n.lower() not in keys] + right_rest)
        for arg in ("where", "group", "having"):
            if q.args.get(arg) is not None:
                q.set(arg, _rewrite(q.args[arg], resolve))
        expressions = []
        for e in q.expressions:
            resolved = _rewrite(e, resolve)
            if isinstance(e, exp.Column) and not isinstance(resolved, exp.Column):
                resolved = exp.alias_(resolved, e.name, quoted=True)  # SELECT k: named k
            expressions.append(resolved)
        q.set("expressions", expressions)
        return star

    def _join_kind(self, join: exp.Join | None) -> str:
        if join is None:
            return "inner"
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if join.args.get("method"):
            raise self.error(join, f"{join.args['method']} JOIN is not supported",
                             "write the join condition explicitly with ON")
        if not side and kind in ("", "INNER", "CROSS"):
            return "inner"
        if side in ("", "LEFT") and kind in ("SEMI", "ANTI"):
            return kind.lower()
        if side in ("LEFT", "RIGHT", "FULL") and kind in ("", "OUTER"):
            return side.lower()
        what = " ".join(w for w in (side, kind) if w) or "this"
        raise self.error(join, f"{what} JOIN is not supported",
                         "the joins are inner, LEFT, RIGHT and FULL [OUTER] JOIN ... ON, and "
                         "[LEFT] SEMI / ANTI JOIN ... ON")

    def _columns_of(self, node: exp.Expr, scope: Scope) -> tuple[set[int], bool]:
        """The FROM sources ``node``'s own columns (not its subqueries') belong to, and whether
        it refers to the enclosing query."""
        found: set[int] = set()
        outer = False
        for col in _own_columns(node):
            i = self._locate(col, scope)
            if i is None:
                if scope.outer is None or self._locate(col, scope.outer) is None:
                    raise self._unknown_column(col, scope)
                outer = True
            else:
                found.add(i)
        return found, outer

    def _classify(self, node: exp.Expr, scope: Scope, pool: list[Conjunct],
                  predicates: list[exp.Expr], correlations: list[Correlation],
                  where: bool = True) -> None:
        if _has_subquery(node):
            predicates.append(node)
            return
        sources, outer = self._columns_of(node, scope)
        if not outer:
            pool.append(Conjunct(node, frozenset(sources), where))
            return
        if isinstance(node, exp.EQ):
            l_sources, l_outer = self._columns_of(node.this, scope)
            r_sources, r_outer = self._columns_of(node.expression, scope)
            if l_outer and not l_sources and r_sources and not r_outer:
                correlations.append(Correlation(node.this, node.expression))
                return
            if r_outer and not r_sources and l_sources and not l_outer:
                correlations.append(Correlation(node.expression, node.this))
                return
        if not _has_subquery(node):
            scope.residuals.append(node)  # compiled by an EXISTS, refused by the others
            return
        raise self.error(node, "a correlated condition other than an equality between the outer "
                         "query's and the subquery's columns is not supported",
                         "correlated subqueries decorrelate into semi/anti joins on equal keys "
                         "only; a non-equi correlation needs a join with an aggregate")

    def _mark_null_supplied(self, items: list[tuple[exp.Expr, exp.Join | None]],
                            kinds: list[str], scope: Scope) -> None:
        """Which sources an outer join may pad with NULLs, and by which join (``Source.
        supplied_by``): a LEFT JOIN's right side, every source before a RIGHT JOIN, both sides
        of a FULL JOIN. A WHERE condition on such a source filters after that join, never
        before (it is not the same query: the padded rows would escape it)."""
        for i, kind in enumerate(kinds):
            if kind in ("right", "full"):
                earlier = [join for _, join in items[1:i] if join is not None]
                if any(not join.args.get("on") for join in earlier):
                    raise self.error(items[i][1], f"{kind.upper()} JOIN after a comma join is "
                                     "not supported", "write every join before it as "
                                     "JOIN ... ON")
            padded = {"left": [i], "right": list(range(i)),
                      "full": list(range(i + 1))}.get(kind, [])
            for j in padded:
                scope.sources[j].null_supplied = True
                scope.sources[j].supplied_by = i

    def _outer_join_keys(self, on: exp.Expr, scope: Scope, right: int, kind: str
                         ) -> OuterKeys:
        """The keys of outer join ``kind`` with source ``right`` (pairs of the joined tables'
        expression and the right side's), the ON conditions on the preserved side's opposite
        alone, which filter that side before the join: the right side's for a LEFT JOIN, the
        joined tables' for a RIGHT JOIN, none for a FULL JOIN; and the other conditions."""
        keys: list[tuple[exp.Expr, exp.Expr]] = []
        left_filters: list[exp.Expr] = []
        residuals: list[exp.Expr] = []
        source = scope.sources[right]
        name = f"{kind.upper()} JOIN"
        for node in _conjuncts(on):
            if _has_subquery(node):
                raise self.error(node, f"a subquery in {name} ... ON is not supported")
            sources, outer = self._columns_of(node, scope)
            if outer:
                raise self.error(node, f"a {name} condition refers to an enclosing query")
            if sources == {right} and kind in ("left", "semi", "anti"):  # the right side first
                source.collection = source.collection.filter(self._render(node, scope))
                continue
            if sources and right not in sources and kind == "right":
                left_filters.append(node)  # filters the joined tables first
                continue
            if isinstance(node, exp.EQ):
                l_sources, _ = self._columns_of(node.this, scope)
                r_sources, _ = self._columns_of(node.expression, scope)
                if r_sources == {right} and l_sources and right not in l_sources \
                        and max(l_sources) < right:
                    keys.append((node.this, node.expression))
                    continue
                if l_sources == {right} and r_sources and right not in r_sources \
                        and max(r_sources) < right:
                    keys.append((node.expression, node.this))
                    continue
            residuals.append(node)
        if not keys:
            raise self.error(on, f"a {name} needs at least one equality between its sides",
                             "an outer join without equal keys would pair every row with "
                             "every row (a cross join)")
        return OuterKeys(keys, left_filters, residuals)

    def _join_pending(self, state: Joined | None, pending: list[int], pool: list[Conjunct],
                      scope: Scope) -> Joined | None:
        pending = list(pending)
        while pending:
            if state is None:
                i = pending.pop(0)
                source = scope.sources[i]
                state = Joined(source.collection,
                               [source.bindings[n.lower()] for n in source.names], {i})
                state = self._apply_covered(state, pool, scope)
                continue
            for i in pending:
                keys = self._inner_keys(state, i, pool, scope)
                if keys:
                    break
            else:
                table = scope.sources[pending[0]]
                raise self.error(table.node, "no equality joins "
                                 f"'{table.qualifier or 'a subquery'}' "
                                 "to the tables before it: a cross join is not supported",
                                 "add a condition a.k = b.k between the tables")
            pending.remove(i)
            for c, _, _ in keys:
                pool.remove(c)
            state = self._inner_join(state, i, keys, scope)
            state = self._apply_covered(state, pool, scope)
        return state

    def _inner_keys(self, state: Joined, right: int, pool: list[Conjunct], scope: Scope
                    ) -> list[tuple[Conjunct, exp.Expr, exp.Expr]]:
        keys = []
        for c in pool:
            if not isinstance(c.node, exp.EQ) or right not in c.sources \
                    or not c.ready(state.members | {right}, scope):
                continue
            l_sources, _ = self._columns_of(c.node.this, scope)
            r_sources, _ = self._columns_of(c.node.expression, scope)
            if l_sources and l_sources <= state.members and r_sources == {right}:
                keys.append((c, c.node.this, c.node.expression))
            elif r_sources and r_sources <= state.members and l_sources == {right}:
                keys.append((c, c.node.expression, c.node.this))
        return keys

    def _inner_join(self, state: Joined, right: int,
                    keys: list[tuple[Conjunct, exp.Expr, exp.Expr]],
                    scope: Scope) -> Joined:
        source = scope.sources[right]
        right_columns = [source.bindings[n.lower()] for n in source.names]
        pairs = [(left, r) for _, left, r in keys
                 if isinstance(left, exp.Column) and isinstance(r, exp.Column)]
        bare = len(pairs) == len(keys)
        if bare:
            l_names = [self._internal(left, scope) for left, _ in pairs]
            r_names = [self._internal(r, scope) for _, r in pairs]
            bare = (len(set(l_names)) == len(l_names) and len(set(r_names)) == len(r_names)
                    and _same_types(state.collection, l_names, source.collection, r_names))
        if bare:
            # inner join on columns: the right key column takes the left key's name (they are
            # equal in every joined row)
            rename = dict(zip(r_names, l_names))
            right_c = source.collection.select(
                *[f"{quote(c)} AS {quote(rename[c])}" if c in rename else quote(c)
                  for c in right_columns])
            for user, internal in list(source.bindings.items()):
                if internal in rename:
                    source.bindings[user] = rename[internal]
                    scope.namer.used.discard(internal.lower())
            on = l_names
            left_c = state.collection
            right_columns = [rename.get(c, c) for c in right_columns]
        else:
            on = [scope.namer.fresh("join_key") for _ in keys]
            left_c = state.collection.select(
                *[quote(c) for c in state.columns],
                *[f"{self._render(left, scope)} AS {quote(n)}"
                  for (_, left, _), n in zip(keys, on)])
            right_c = source.collection.select(
                *[quote(c) for c in right_columns],
                *[f"{self._render(r, scope)} AS {quote(n)}" for (_, _, r), n in zip(keys, on)])
        joined = left_c.join(right_c, on=on)
        columns = on + [c for c in state.columns if c not in on] \
            + [c for c in right_columns if c not in on]
        return Joined(joined, columns, state.members | {right})

    def _outer_join(self, state: Joined, right: int, keys: OuterKeys, scope: Scope,
                    kind: str) -> Joined:
        source = scope.sources[right]
        right_columns = [source.bindings[n.lower()] for n in source.names]
        on = [scope.namer.fresh("join_key") for _ in keys.pairs]
        left = state.collection
        if keys.left_filters:
            left = left.filter(" AND ".join(f"({self._render(n, scope)})"
                                            for n in keys.left_filters))
        left_c = left.select(
            *[quote(c) for c in state.columns],
            *[f"{self._render(lk, scope)} AS {quote(n)}" for (lk, _), n in zip(keys.pairs, on)])
        right_c = source.collection.select(
            *[quote(c) for c in right_columns],
            *[f"{self._render(r, scope)} AS {quote(n)}" for (_, r), n in zip(keys.pairs, on)])
        columns = on + state.columns + right_columns
        members = state.members | {right}
        if not keys.residuals:
            join = {"left": left_c.left_join, "right": left_c.right_join,
                    "full": left_c.full_join}[kind]
            return Joined(join(right_c, on=on), columns, members)
        # rows match when their keys are equal and the residual conditions hold: the inner
        # join filtered, plus the preserved sides' rows that are in none of its rows
        inner = left_c.join(right_c, on=on).filter(" AND ".join(
            f"({self._render(n, scope)})" for n in keys.residuals))
        parts = [inner]
        if kind in ("left", "full"):
            parts.append(_unmatched(left_c, on + state.columns, inner).conform_to(inner))
        if kind in ("right", "full"):
            parts.append(_unmatched(right_c, on + right_columns, inner).conform_to(inner))
        return Joined(parts[0].union(*parts[1:]), columns, members)

    def _semi_join(self, state: Joined, right: int, keys: OuterKeys, scope: Scope,
                   kind: str) -> Joined:
        """``[LEFT] SEMI JOIN`` (the joined rows with a match, each once as many times as it
        occurs) or ``ANTI JOIN`` (those without one) on the keys; with other ON conditions,
        a match is a row of the inner join filtered by them, and the rows without one are
        counted as an outer join's (``_unmatched``). The right side's columns are not in
        the result."""
        source = scope.sources[right]
        source.hidden = False  # its ON clause's expressions are rendered here
        try:
            return self._semi_join_of(state, right, keys, scope, kind)
        finally:
            source.hidden = True

    def _semi_join_of(self, state: Joined, right: int, keys: OuterKeys, scope: Scope,
                      kind: str) -> Joined:
        source = scope.sources[right]
        on = [scope.namer.fresh("join_key") for _ in keys.pairs]
        left_c = state.collection.select(
            *[quote(c) for c in state.columns],
            *[f"{self._render(lk, scope)} AS {quote(n)}" for (lk, _), n in zip(keys.pairs, on)])
        cols = [quote(c) for c in state.columns]
        members = state.members | {right}
        if not keys.residuals:
            right_c = source.collection.select(
                *[f"{self._render(r, scope)} AS {quote(n)}" for (_, r), n in zip(keys.pairs, on)])
            joined = (left_c.semijoin(right_c, on) if kind == "semi"
                      else left_c.antijoin(right_c, on))
            return Joined(joined.select(*cols), list(state.columns), members)
        right_columns = [source.bindings[n.lower()] for n in source.names]
        right_c = source.collection.select(
            *[quote(c) for c in right_columns],
            *[f"{self._render(r, scope)} AS {quote(n)}" for (_, r), n in zip(keys.pairs, on)])
        matched = left_c.join(right_c, on=on).filter(" AND ".join(
            f"({self._render(n, scope)})" for n in keys.residuals))
        unmatched = _unmatched(left_c, on + state.columns, matched).select(*cols)
        result = unmatched if kind == "anti" else left_c.select(*cols).minus(unmatched)
        return Joined(result, list(state.columns), members)

    def _apply_covered(self, state: Joined, pool: list[Conjunct], scope: Scope) -> Joined:
        """Filter by the conjuncts on tables joined so far (the earlier, the smaller)."""
        covered = [c for c in pool if c.sources and c.sources <= state.members
                   and c.ready(state.members, scope)]
        if not covered:
            return state
        for c in covered:
            pool.remove(c)
        predicate = " AND ".join(f"({self._render(c.node, scope)})" for c in covered)
        return Joined(state.collection.filter(predicate), state.columns, state.members)

    # -- subqueries in WHERE ---------------------------------------------------------------
    def _apply_subquery_predicate(self, node: exp.Expr, scope: Scope,
                                  ctes: Ctes) -> None:
        negated = isinstance(node, exp.Not)
        inner = node.this if negated else node
        assert scope.collection is not None
        if isinstance(inner, exp.In) and inner.args.get("query") is not None:
            query = inner.args["query"]
            sub = query.this if isinstance(query, exp.Subquery) else query
            relation, outer_exprs = self._subquery_keys(sub, scope, ctes, inner.this)
            if negated and not self._never_null(inner.this, scope, relation):
                raise self.error(node, "NOT IN (subquery) over columns that may be NULL is not "
                                 "supported",
                                 "SQL's NOT IN is unknown when either side holds a NULL; write "
                                 "NOT EXISTS (... WHERE inner = outer), or declare the columns "
                                 "NOT NULL in CREATE TABLE")
        elif isinstance(inner, exp.Exists):
            relation, outer_exprs = self._subquery_keys(inner.this, scope, ctes, None)
        elif (not negated and type(node) in _COMPARISONS
              and any(isinstance(side, exp.Subquery) for side in (node.this, node.expression))):
            self._apply_scalar_comparison(node, scope, ctes)
            return
        else:
            raise self.error(node, "this subquery is not supported",
                             "subqueries compile as WHERE conjuncts x IN (SELECT ...), "
                             "EXISTS (...), NOT EXISTS (...) and x < (SELECT agg(...) ... WHERE "
                             "inner.k = outer.k); other scalar subqueries need a global aggregate "
                             "the circuit does not have yet")
        on = [scope.namer.fresh("match_key") for _ in outer_exprs]
        left = scope.collection.select(
            *[quote(c) for c in scope.columns],
            *[f"{self._render(e, scope)} AS {quote(n)}" for e, n in zip(outer_exprs, on)])
        right = relation.collection.select(
            *[f"{quote(c)} AS {quote(n)}" for c, n in zip(relation.columns, on)])
        scope.collection = left.antijoin(right, on) if negated else left.semijoin(right, on)
        scope.columns = scope.columns + on

    def _apply_scalar_comparison(self, node: exp.Expr, scope: Scope, ctes: Ctes) -> None:
        """``x OP (SELECT agg(...) FROM ...)`` as a WHERE conjunct: the rows joined with the
        subquery's value (``_scalar_subquery``), then the comparison as a filter."""
        assert scope.collection is not None
        scope.collection, scope.columns, sides = self._compare_with_scalar(
            node, scope.collection, scope.columns, scope, ctes,
            lambda side: self._render(side, scope), lambda c: self._render(c.outer, scope))
        scope.collection = scope.collection.filter(sides)

    def _compare_with_scalar(self, node: exp.Expr, collection: Collection, columns: list[str],
                             scope: Scope, ctes: Ctes, render: Callable[[exp.Expr], str],
                             render_outer: Callable[[Correlation], str]
                             ) -> tuple[Collection, list[str], str]:
        """``collection`` (``columns``) joined with the value of the scalar subquery on one
        side of comparison ``node``: the joined collection, its columns and the comparison as
        a predicate over them (the other side rendered by ``render``)."""
        query = node.this if isinstance(node.this, exp.Subquery) else node.expression
        if isinstance(node.this, exp.Subquery) and isinstance(node.expression, exp.Subquery):
            raise self.error(node, "a comparison of two scalar subqueries is not supported")
        right, correlations = self._scalar_subquery(query, scope, ctes)
        on = [scope.namer.fresh("match_key") for _ in range(max(1, len(correlations)))]
        value_name = scope.namer.fresh("scalar_value")
        outer = [render_outer(c) for c in correlations] or ["0"]
        left = collection.select(*[quote(c) for c in columns],
                                 *[f"{e} AS {quote(n)}" for e, n in zip(outer, on)])
        right = right.select(*[f"{quote(k)} AS {quote(n)}" for k, n in
                               zip(right_keys(len(on)), on)],
                             f"{quote(SCALAR_VALUE)} AS {quote(value_name)}")
        joined = left.join(right, on)
        sides = [quote(value_name) if side is query else f"({render(side)})"
                 for side in (node.this, node.expression)]
        return joined, on + columns + [value_name], \
            f"{sides[0]} {_COMPARISONS[type(node)]} {sides[1]}"

    def _scalar_subquery(self, query: exp.Expr, outer: Scope, ctes: Ctes
                         ) -> tuple[Collection, list[Correlation]]:
        """The value of scalar subquery ``query`` as a collection of columns ``key_0``...
        (``right_keys``) and ``SCALAR_VALUE``, and the equalities with the enclosing query
        (``outer``) it is correlated by.

        Correlated (``WHERE inner.k = outer.k``): the subquery grouped by its correlated
        columns; exact because the value is NULL where the subquery has no row (only
        aggregates that are NULL over no rows, and arithmetic on them, are accepted), and a
        comparison with NULL drops the row as the missing join partner does. Not correlated:
        a global aggregate, one row at every step (``key_0`` is the constant 0)."""
        sub = query.this
        if not isinstance(sub, exp.Select) or sub.args.get("with_"):
            raise self.error(query, "a scalar subquery must be one SELECT")
        self._refuse_modifiers(sub)
        if sub.args.get("group") or sub.args.get("having") or sub.args.get("distinct") \
                or len(sub.expressions) != 1:
            raise self.error(query, "a scalar subquery compiles only as one aggregate without "
                             "GROUP BY, HAVING or DISTINCT")
        sub_scope, correlations = self._from_where(sub, ctes, outer)
        self._refuse_residuals(sub_scope)
        item = sub.expressions[0].unalias()
        if not _aggregates(item):
            raise self.error(item, "a scalar subquery's value must be an aggregate",
                             "without one the subquery may have no row or many")
        if correlations:
            bad = next((n for n in _own_nodes(item) if not isinstance(n, _NULL_ON_EMPTY)
                        and not (isinstance(n, exp.Column) and n.find_ancestor(exp.AggFunc))),
                       None)
            if bad is not None:
                raise self.error(bad, "this correlated scalar subquery's value is not "
                                 "supported", "it must be sum/avg/min/max (with arithmetic and "
                                 "literals), which is NULL when no row matches; count and "
                                 "coalesce are not")
        keys = right_keys(len(correlations))
        synthetic = exp.Select(
            expressions=[exp.alias_(c.inner.copy(), k, quoted=True)
                         for c, k in zip(correlations, keys)]
            + [exp.alias_(item.copy(), SCALAR_VALUE, quoted=True)],
            group=exp.Group(expressions=[c.inner.copy() for c in correlations])
            if correlations else None)
        value = self._project(synthetic, sub_scope).collection
        if not correlations:
            value = value.select(f"0 AS {quote(right_keys(1)[0])}", quote(SCALAR_VALUE))
        return value, correlations

    def _subquery_keys(self, sub: exp.Expr, outer: Scope, ctes: Ctes,
                       in_expr: exp.Expr | None
                       ) -> tuple[Relation, list[exp.Expr]]:
        """The subquery as a relation of key columns, and the outer expressions they match."""
        if not isinstance(sub, exp.Select) or sub.args.get("with_"):
            # not correlated (a set operation, a CTE)
            relation = self.relation(sub, ctes, unnamed=in_expr is not None)
            if in_expr is None:
                raise self.error(sub, "EXISTS over a query that is not correlated is not "
                                 "supported", "correlate it with WHERE inner.k = outer.k")
            return self._single_column(sub, relation), [in_expr]
        self._refuse_modifiers(sub)
        scope, correlations = self._from_where(sub, ctes, outer)
        if scope.residuals and (in_expr is not None or not correlations):
            self._refuse_residuals(scope)
        if not correlations:
            if in_expr is None:
                raise self.error(sub, "EXISTS over a query that is not correlated is not "
                                 "supported", "correlate it with WHERE inner.k = outer.k")
            return self._single_column(sub, self._project(sub, scope, unnamed=True)), [in_expr]
        if sub.args.get("group") or sub.args.get("having") or any(
                _aggregates(e) for e in sub.expressions):
            raise self.error(sub, "a correlated subquery with aggregates is not supported",
                             "only correlated subqueries that are semi/anti joins on equal keys "
                             "compile")
        if scope.residuals:
            return self._residual_matches(scope, outer, correlations)
        inner_exprs = [c.inner for c in correlations]
        outer_exprs = [c.outer for c in correlations]
        if in_expr is not None:
            if len(sub.expressions) != 1 or isinstance(sub.expressions[0], exp.Star):
                raise self.error(sub, "an IN subquery must select exactly one column")
            inner_exprs.insert(0, sub.expressions[0].unalias())
            outer_exprs.insert(0, in_expr)
        names = [f"key_{i}" for i in range(len(inner_exprs))]
        assert scope.collection is not None
        keys = scope.collection.select(
            *[f"{self._render(e, scope)} AS {quote(n)}" for e, n in zip(inner_exprs, names)])
        return Relation(keys, tuple(names)), outer_exprs

    def _refuse_residuals(self, scope: Scope) -> None:
        if scope.residuals:
            raise self.error(scope.residuals[0], "a correlated condition other than an equality "
                             "between the outer query's and the subquery's columns is not "
                             "supported here", "only EXISTS / NOT EXISTS with at least one "
                             "correlated equality compile it (as a join, then a filter)")

    def _residual_matches(self, scope: Scope, outer: Scope, correlations: list[Correlation]
                          ) -> tuple[Relation, list[exp.Expr]]:
        """An EXISTS subquery correlated by equalities and by other conditions (``residuals``,
        e.g. ``inner.s <> outer.s``): the distinct values of the enclosing query's correlated
        expressions and of its columns the residuals read for which an inner row matches (the
        enclosing rows joined with the subquery's on the equalities, then filtered by the
        residuals), and those outer expressions. The enclosing query semi- or anti-joins with
        them on all of them; a NULL among them matches nothing, as the conditions say."""
        assert outer.collection is not None and scope.collection is not None
        outer_columns: dict[str, exp.Column] = {}
        for node in scope.residuals:
            for col in _own_columns(node):
                if self._locate(col, scope) is None:
                    outer_columns.setdefault(self._render(col, outer), col)
        keys = [scope.namer.fresh("outer_key") for _ in correlations]
        values = {text: scope.namer.fresh("outer_value") for text in outer_columns}
        enclosing = outer.collection.select(
            *[f"{self._render(c.outer, outer)} AS {quote(k)}" for c, k in zip(correlations, keys)],
            *[f"{text} AS {quote(values[text])}" for text in outer_columns]).distinct()
        inner = scope.collection.select(
            *[quote(c) for c in scope.columns],
            *[f"{self._render(c.inner, scope)} AS {quote(k)}" for c, k in zip(correlations, keys)])

        def rename(n: exp.Expr) -> exp.Expr | None:
            if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
                if self._locate(n, scope) is not None:
                    return exp.column(self._internal(n, scope), quoted=True)
                return exp.column(values[self._render(n, outer)], quoted=True)
            return None

        predicate = " AND ".join(f"({_rewrite(n, rename).sql(dialect='spark')})"
                                 for n in scope.residuals)
        matched = enclosing.join(inner, keys).filter(predicate).select(
            *[quote(k) for k in keys], *[quote(values[t]) for t in outer_columns]).distinct()
        return (Relation(matched, tuple([*keys, *values.values()])),
                [*(c.outer for c in correlations), *outer_columns.values()])

    def _single_column(self, sub: exp.Expr, relation: Relation) -> Relation:
        if len(relation.columns) != 1:
            raise self.error(sub, f"an IN subquery must select exactly one column, this one "
                             f"selects {len(relation.columns)}")
        return relation

    def _never_null(self, expr: exp.Expr, scope: Scope, relation: Relation) -> bool:
        if not isinstance(expr, exp.Column) or not relation.not_null:
            return False
        i = self._locate(expr, scope)
        return (i is not None and scope.sources[i].never_null(expr.name.lower())
                and relation.columns[0].lower() in relation.not_null)

    # -- SELECT list, GROUP BY, HAVING -----------------------------------------------------
    def _project(self, q: exp.Select, scope: Scope, unnamed: bool = False) -> Relation:
        """The SELECT list over ``scope``; ``unnamed``: see ``relation``."""
        items = self._items(q, scope, unnamed)
        seen: list[str] = []
        for pos, (name, node) in enumerate(items):
            if name.lower() in {s.lower() for s in seen}:
                if not unnamed:
                    raise self.error(node, f"the view has two columns named '{name}'",
                                     "give one of them another name with AS")
                name = fresh_name(name, [n for n, _ in items] + seen)
                items[pos] = (name, node)
            seen.append(name)
        names = [name for name, _ in items]
        for _, node in items:
            if _has_subquery(node):
                raise self.error(node, "a subquery in the SELECT list is not supported",
                                 "join with the subquery in FROM instead")
        having = q.args.get("having")
        grouped = (q.args.get("group") is not None or having is not None
                   or any(_aggregates(node) for _, node in items))
        assert scope.collection is not None
        if any(any(node.find_all(exp.Window)) for _, node in items):
            return self._ranked(q, scope, items, grouped)
        if grouped:
            collection = self._aggregate(q, scope, items)
        else:
            collection = scope.collection.select(
                *[f"{self._render(node, scope)} AS {quote(name)}" for name, node in items])
        distinct = q.args.get("distinct")
        if distinct is not None:
            if distinct.args.get("on"):
                raise self.error(distinct, "DISTINCT ON is not supported")
            collection = collection.distinct()
        not_null = frozenset(
            name.lower() for name, node in items if isinstance(node, exp.Column) and
            (i := self._locate(node, scope)) is not None
            and scope.sources[i].never_null(node.name.lower()))
        return Relation(collection, tuple(names), not_null)

    def _ranked(self, q: exp.Select, scope: Scope, items: list[tuple[str, exp.Expr]],
                grouped: bool) -> Relation:
        """A SELECT with a ``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) AS name``
        column (or ``RANK()``, ``DENSE_RANK()``): a ``Ranking`` of its other columns, computed
        by ``top_k`` with as many places as the query reading it keeps (``_source``). The
        PARTITION BY and ORDER BY expressions are computed as columns first; rows that tie on
        the ORDER BY are numbered by ROW_NUMBER in the order of all their columns (Spark
        numbers them in whatever order they arrive); RANK and DENSE_RANK give them one place."""
        windows = [(name, node) for name, node in items if any(node.find_all(exp.Window))]
        name, node = windows[0]
        window = next(iter(node.find_all(exp.Window)))
        if len(windows) > 1:
            raise self.error(windows[1][1], "one window function column per SELECT is supported",
                             "number the rows in a subquery and again in the enclosing query")
        numberings = {exp.RowNumber: "row_number", exp.Rank: "rank",
                      exp.DenseRank: "dense_rank"}
        if not (isinstance(node, exp.Window) and type(node.this) in numberings
                and not node.this.expressions):
            raise self.error(window, "of the window functions, only ROW_NUMBER(), RANK() and "
                             "DENSE_RANK() OVER (PARTITION BY ... ORDER BY ...) AS name compile, "
                             "as a column of their own", "aggregates over windows, other window "
                             "functions and expressions of them need operators the circuit "
                             "lacks; WHERE rn <= k on a numbering column is a top-k")
        numbering = numberings[type(node.this)]
        function = f"{numbering.upper()}()"
        if name.startswith("_"):
            raise self.error(node, f"the {function} column '{name}' starts with '_'",
                             "names starting with '_' belong to the engine: choose another")
        if grouped or q.args.get("distinct") is not None:
            raise self.error(window, f"{function} in a SELECT with GROUP BY, aggregates or "
                             "DISTINCT is not supported", "group in a subquery or CTE and "
                             "number its rows in the enclosing SELECT")
        for arg, what in (("spec", "a window frame"), ("alias", "a named window")):
            if node.args.get(arg):
                raise self.error(window, f"{function} OVER with {what} is not supported",
                                 "write OVER (PARTITION BY ... ORDER BY ...)")
        order = node.args.get("order")
        if order is None:
            raise self.error(window, f"{function} needs ORDER BY in its OVER clause",
                             "without it the numbering is arbitrary")
        names = [n for n, _ in items]
        rendered = {n: self._render(e, scope) for n, e in items if n != name}
        exprs = [f"{r} AS {quote(n)}" for n, r in rendered.items()]
        taken = list(names)

        def key_column(e: exp.Expr, base: str) -> str:
            """The column holding ``e``: a column of the SELECT computing the same, or a new
            one (dropped after numbering)."""
            text = self._render(e, scope)
            same = [n for n, r in rendered.items() if r == text]
            if same:
                return same[0]
            column = fresh_name(base, taken)
            taken.append(column)
            rendered[column] = text
            exprs.append(f"{text} AS {quote(column)}")
            return column

        partition = [key_column(e, "partition_key") for e in node.args.get("partition_by") or []]
        keys = []
        for item in order.expressions:
            column = key_column(item.this, "order_key")
            nulls = item.args.get("nulls_first")
            keys.append(f"{quote(column)} {'DESC' if item.args.get('desc') else 'ASC'}"
                        + ("" if nulls is None else f" NULLS {'FIRST' if nulls else 'LAST'}"))
        assert scope.collection is not None
        base = scope.collection.select(*exprs)
        not_null = frozenset(
            [n.lower() for n, e in items if isinstance(e, exp.Column) and
             (i := self._locate(e, scope)) is not None
             and scope.sources[i].never_null(e.name.lower())] + [name.lower()])
        return Relation(Ranking(base, name, tuple(keys), tuple(partition), numbering),
                        tuple(names), not_null)

    def _rank_bound(self, index: int, relations: list[tuple[Relation, str]], kinds: list[str],
                    conjuncts: list[exp.Expr]) -> int:
        """The places the enclosing query keeps of its ranked FROM item ``index`` (of
        ``relations``, with their qualifiers, joined as ``kinds``): the least k of its WHERE
        conjuncts ``rn <= k``, ``rn < k + 1``, ``rn = k``, ``k = rn``, ``rn BETWEEN a AND k``
        on that item's ROW_NUMBER column ``rn`` (a reference that resolves to it: not to
        another item's column of that name, nor to a SEMI/ANTI JOIN's right side, which WHERE
        cannot name); every place without one. The conjunct still filters: it keeps no row
        numbered past k, so only the top k of each partition can reach the result."""
        relation, qualifier = relations[index]
        assert relation.ranking is not None
        rank = relation.ranking.column.lower()

        def is_rank(e: exp.Expr) -> bool:
            if not isinstance(e, exp.Column) or e.name.lower() != rank:
                return False
            table = e.table.lower()
            named = [j for j, (r, q) in enumerate(relations)
                     if rank in (c.lower() for c in r.columns) and table in ("", q)
                     and kinds[j] not in ("semi", "anti")]
            return named == [index]

        def number(e: exp.Expr) -> int | None:
            if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
                return int(e.this)
            return None

        bounds = []
        for c in conjuncts:
            if isinstance(c, exp.Between) and is_rank(c.this):
                high = number(c.args["high"])
                bounds.append(high)
                continue
            if not isinstance(c, (exp.LTE, exp.LT, exp.EQ, exp.GTE, exp.GT)):
                continue
            left, right = c.this, c.expression
            if isinstance(c, (exp.GTE, exp.GT)) or (isinstance(c, exp.EQ) and is_rank(right)):
                left, right = right, left  # k >= rn, k = rn
            if not is_rank(left) or (n := number(right)) is None:
                continue
            bounds.append(n - 1 if isinstance(c, (exp.LT, exp.GT)) else n)
        known = [b for b in bounds if b is not None]
        return max(1, min(known + [EVERY_PLACE]))

    def _items(self, q: exp.Select, scope: Scope, unnamed: bool = False
               ) -> list[tuple[str, exp.Expr]]:
        """The SELECT list as (output name, expression), ``*`` and ``t.*`` expanded; with
        ``unnamed``, a computed column without AS is named ``col<position>``."""
        items: list[tuple[str, exp.Expr]] = []
        for e in q.expressions:
            star_of = None
            if isinstance(e, exp.Star):
                star_of = ""
            elif isinstance(e, exp.Column) and isinstance(e.this, exp.Star):
                star_of = e.table.lower()
            if star_of == "" and scope.star is not None:
                items += [(n, e.copy()) for n, e in scope.star]
                continue
            if star_of is not None:
                matched = False
                for source in scope.sources:
                    if (star_of and source.qualifier != star_of) or source.hidden:
                        continue
                    matched = True
                    for n in source.names:
                        col = exp.column(n, table=source.qualifier or None, quoted=True)
                        items.append((n, col))
                if not matched:
                    raise self.error(e, f"no table '{star_of}' in FROM for {star_of}.*")
                continue
            if isinstance(e, exp.Alias):
                items.append((e.alias, e.this))
            elif isinstance(e, exp.Column):
                items.append((e.name, e))
            elif unnamed:
                items.append((f"col{len(items) + 1}", e))
            else:
                raise self.error(e, "a computed column needs a name",
                                 "add AS name (the view's columns are named by the SELECT list)")
        # a name no table in FROM has may be an item before it (Spark's lateral column alias:
        # ``qty * price AS gross, gross * 0.2 AS vat``), outside aggregate calls and windows
        before: dict[str, exp.Expr] = {}
        for i, (name, node) in enumerate(items):
            if before:
                node = _with_select_aliases(node, before,
                                            lambda c: self._locate(c, scope) is not None)
                items[i] = (name, node)
            before.setdefault(name.lower(), node)
        return items

    def _aggregate(self, q: exp.Select, scope: Scope,
                   items: list[tuple[str, exp.Expr]]) -> Collection:
        assert scope.collection is not None
        group = q.args.get("group")
        having = q.args.get("having")
        group_exprs: list[exp.Expr] = list(group.expressions) if group else []
        if group is not None and group.args.get("all"):  # GROUP BY ALL: the items without
            group_exprs = [node for _, node in items if not _aggregates(node)]  # aggregates
        by_alias = {name.lower(): node for name, node in items}
        # in HAVING, a grouping column's name is that column before a SELECT alias of it
        grouping = {g.name.lower() for g in group_exprs if isinstance(g, exp.Column)
                    and self._locate(g, scope) is not None}
        having_condition = None if having is None else _with_select_aliases(
            having.this, {n: e for n, e in by_alias.items() if n not in grouping})
        aggregate_nodes = [a for _, node in items for a in _aggregates(node)]
        if having_condition is not None:
            aggregate_nodes += _aggregates(having_condition)
        pre: dict[str, str] = {}  # column -> its expression (the select before grouping)
        keys: dict[str, str] = {}  # rendered group expression -> key column
        for g in group_exprs:
            if isinstance(g, exp.Literal) and not g.is_string:
                position = int(g.this)
                if not 1 <= position <= len(items):
                    raise self.error(g, f"GROUP BY {position}: the SELECT list has "
                                     f"{len(items)} columns")
                g = items[position - 1][1]
            elif (isinstance(g, exp.Column) and not g.table
                  and self._locate(g, scope) is None and g.name.lower() in by_alias):
                g = by_alias[g.name.lower()]
            if _aggregates(g):
                raise self.error(g, "an aggregate in GROUP BY")
            rendered = self._render(g, scope)
            if rendered in keys:
                continue
            if isinstance(g, exp.Column):
                name = self._internal(g, scope)
                pre[name] = quote(name)
            else:
                name = scope.namer.fresh("group_key")
                pre[name] = f"{rendered} AS {quote(name)}"
            keys[rendered] = name
        aggs: dict[str, tuple[str, str | None]] = {}  # rendered call -> (name, fn(arg) column)
        calls: dict[str, str] = {}  # rendered aggregate call -> output column
        distinct_args: dict[str, str] = {}  # argument column -> its column of distinct values
        computed = False
        for node in aggregate_nodes:
            fn, arg, distinct = self._aggregate_call(node)
            call = self._call_key(node, scope)
            if call in calls:
                continue
            if arg is None:
                column = None
            else:
                rendered = self._render(arg, scope)
                if isinstance(arg, exp.Column):
                    column = self._internal(arg, scope)
                    pre[column] = quote(column)
                else:
                    column = scope.namer.fresh("agg_arg")
                    pre[column] = f"{rendered} AS {quote(column)}"
                    computed = True
                if distinct:
                    column = distinct_args.setdefault(column, scope.namer.fresh("distinct_arg"))
            name = scope.namer.fresh("agg")
            calls[call] = name
            aggs[name] = (fn, column)
        if not aggs:
            aggs[scope.namer.fresh("agg")] = ("count", None)
        source = scope.collection
        if computed or distinct_args or any(e != quote(c) for c, e in pre.items()):
            source = source.select(*pre.values())
        if distinct_args:
            source, marker = self._with_distinct_values(source, list(pre),
                                                        list(keys.values()), distinct_args,
                                                        scope)
            aggs = {name: ("count", marker) if (fn, col) == ("count", None) else (fn, col)
                    for name, (fn, col) in aggs.items()}
        spec = {name: f"{fn}({quote(col) if col else '*'})" for name, (fn, col) in aggs.items()}
        # no GROUP BY: a global aggregate, one row also over no rows (count 0, the rest NULL)
        grouped = source.group_by(*keys.values()).agg(**spec) if keys else source.agg(**spec)

        def post(node: exp.Expr) -> str:
            return _rewrite(node, lambda n: self._after_grouping(n, scope, keys, calls)).sql(
                dialect="spark")

        if having_condition is not None:
            columns = [*keys.values(), *aggs]
            plain = []
            for conjunct in _conjuncts(having_condition):
                if not _has_subquery(conjunct):
                    plain.append(conjunct)
                    continue
                if type(conjunct) not in _COMPARISONS or not any(
                        isinstance(side, exp.Subquery)
                        for side in (conjunct.this, conjunct.expression)):
                    raise self.error(conjunct, "this subquery in HAVING is not supported",
                                     "HAVING compiles a comparison with a scalar subquery, "
                                     "agg(...) > (SELECT agg(...) FROM ...)")
                grouped, columns, predicate = self._compare_with_scalar(
                    conjunct, grouped, columns, scope, scope.ctes, post,
                    self._refuse_correlation_in_having)
                grouped = grouped.filter(predicate)
            if plain:
                grouped = grouped.filter(" AND ".join(f"({post(c)})" for c in plain))
        return grouped.select(*[f"{post(node)} AS {quote(name)}" for name, node in items])

    def _aggregate_call(self, node: exp.Expr) -> tuple[str, exp.Expr | None, bool]:
        """Aggregate call ``node`` as (function, argument, DISTINCT): the argument is None for
        ``count(*)`` (also ``count(1)``); ``min``/``max`` of DISTINCT values are plain ones."""
        fn = AGGREGATES.get(type(node))
        if fn is None:
            spelled = node.sql(dialect="spark").split("(", 1)[0].strip().lower() or node.key
            raise self.error(node, f"aggregate {spelled}() is not supported",
                             "the aggregates are count(*), count, sum, avg, min, max, and "
                             "count/sum/avg(DISTINCT x)")
        arg = node.this
        distinct = isinstance(arg, exp.Distinct) or bool(node.args.get("distinct"))
        if isinstance(arg, exp.Distinct):
            if len(arg.expressions) != 1:
                raise self.error(node, f"{fn}(DISTINCT ...) of {len(arg.expressions)} "
                                 "expressions is not supported",
                                 "count the distinct rows of a subquery that selects "
                                 "DISTINCT a, b")
            arg = arg.expressions[0]
        if arg is not None and _aggregates(arg):
            raise self.error(node, "an aggregate inside an aggregate")
        if fn == "count" and not distinct and (arg is None or isinstance(arg, exp.Star) or (
                isinstance(arg, exp.Literal) and not isinstance(arg, exp.Null))):
            return fn, None, False
        if distinct and isinstance(arg, exp.Star):
            raise self.error(node, "count(DISTINCT *) is not supported",
                             "name the columns: count(DISTINCT x)")
        return fn, arg, distinct and fn in ("count", "sum", "avg")

    def _call_key(self, node: exp.Expr, scope: Scope) -> str:
        """The aggregate call ``node`` as text: equal for calls of one value."""
        fn, arg, distinct = self._aggregate_call(node)
        if arg is None:
            return "count(*)"
        return f"{fn}({'DISTINCT ' if distinct else ''}{self._render(arg, scope)})"

    def _with_distinct_values(self, source: Collection, columns: list[str], keys: list[str],
                              distinct_args: dict[str, str], scope: Scope
                              ) -> tuple[Collection, str]:
        """``source`` (``columns``: the group keys and the aggregates' arguments) ready for
        DISTINCT aggregates: its rows, with a marker column of 1 and the distinct-value columns
        NULL, plus for each argument of a DISTINCT aggregate its distinct values per group (a
        ``distinct`` of keys and argument) with every other column NULL. The plain aggregates
        ignore the distinct rows (their arguments are NULL; ``count(*)`` becomes ``count`` of
        the marker), and ``fn(DISTINCT x)`` is ``fn`` of x's distinct-value column, which only
        the distinct rows have. Returns the collection and the marker column."""
        marker = scope.namer.fresh("row_marker")
        rows = source.select(
            *[quote(c) for c in columns],
            *[f"CASE WHEN false THEN {quote(arg)} END AS {quote(values)}"
              for arg, values in distinct_args.items()],
            f"1 AS {quote(marker)}")
        sides = [rows]
        for arg, values in distinct_args.items():
            distinct = source.select(*[quote(k) for k in keys],
                                     f"{quote(arg)} AS {quote(values)}").distinct()
            sides.append(distinct.conform_to(rows))
        return rows.union(*sides[1:]), marker

    def _refuse_correlation_in_having(self, correlation: Correlation) -> str:
        raise self.error(correlation.outer, "a correlated subquery in HAVING is not supported",
                         "correlate it in WHERE, or join with the subquery grouped by its key")

    def _after_grouping(self, node: exp.Expr, scope: Scope, keys: dict[str, str],
                        calls: dict[str, str]) -> exp.Expr | None:
        """``node`` of a SELECT item or HAVING over the grouped rows: an aggregate or a group
        key becomes its column; None leaves the node (its children are visited)."""
        if type(node) in AGGREGATES:
            return exp.column(calls[self._call_key(node, scope)], quoted=True)
        if isinstance(node, (exp.Literal, exp.Null, exp.Boolean)) or not _own_columns(node):
            return None
        rendered = self._render(node, scope)
        if rendered in keys:
            return exp.column(keys[rendered], quoted=True)
        if isinstance(node, exp.Column):
            raise self.error(node, f"column '{node.sql(dialect='spark')}' is neither grouped "
                             "nor aggregated", "add it to GROUP BY or aggregate it")
        return None

    # -- columns ---------------------------------------------------------------------------
    def _locate(self, col: exp.Column, scope: Scope) -> int | None:
        """The index of the FROM source of ``scope`` column ``col`` names (None: none)."""
        name, table = col.name.lower(), col.table.lower()
        hits = [i for i, s in enumerate(scope.sources)
                if name in s.bindings and (not table or s.qualifier == table) and not s.hidden]
        if len(hits) > 1:
            raise self.error(col, f"column '{col.name}' is ambiguous: it is in "
                             f"{[scope.sources[i].qualifier for i in hits]}",
                             "qualify it with its table's name or alias")
        return hits[0] if hits else None

    def _unknown_column(self, col: exp.Column, scope: Scope) -> SqlError:
        known = sorted({f"{s.qualifier + '.' if s.qualifier else ''}{n}"
                        for s in scope.sources if not s.hidden for n in s.names})
        return self.error(col, f"unknown column '{col.sql(dialect='spark')}'",
                          f"the tables in FROM have {known}")

    def _internal(self, col: exp.Column, scope: Scope) -> str:
        i = self._locate(col, scope)
        if i is None:
            if scope.outer is not None and self._locate(col, scope.outer) is not None:
                raise self.error(col, "a reference to the enclosing query is supported only "
                                 "in an equality of the subquery's WHERE clause")
            raise self._unknown_column(col, scope)
        return scope.sources[i].bindings[col.name.lower()]

    def _render(self, node: exp.Expr, scope: Scope) -> str:
        """``node`` as Spark SQL text over the internal column names."""
        def rename(n: exp.Expr) -> exp.Expr | None:
            if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
                return exp.column(self._internal(n, scope), quoted=True)
            if isinstance(n, (exp.Subquery, exp.Select)):
                raise self.error(n, "a subquery here is not supported",
                                 "subqueries compile as WHERE conjuncts IN / EXISTS / NOT EXISTS")
            return None
        return _rewrite(node, rename).sql(dialect="spark")


def _rewrite(node: exp.Expr,
             replace: Callable[[exp.Expr], exp.Expr | None]) -> exp.Expr:
    """A copy of ``node`` with every node for which ``replace`` returns an expression replaced
    by it (top-down: a replaced node's children are not visited)."""
    def visit(n: exp.Expr) -> exp.Expr:
        new = replace(n)
        if new is not None:
            return new
        for child in list(n.iter_expressions()):
            replaced = visit(child)
            if replaced is not child:
                child.replace(replaced)
        return n
    original = node
    copy = node.copy()
    copy_meta(original, copy)
    return visit(copy)


def _unmatched(side: Collection, columns: list[str], matched: Collection) -> Collection:
    """The rows of ``side`` (its ``columns``) that occur in none of ``matched``'s rows, with
    their multiplicity: per distinct row of ``side``, its multiplicity m and the number of
    ``matched`` rows holding it, grouped (so NULLs compare equal); a row none holds is repeated
    m times."""
    cols = [quote(c) for c in columns]
    own, seen = fresh_name("own_rows", columns), fresh_name("matched_rows", columns)
    keep = fresh_name("unmatched_rows", columns + [own, seen])
    counted = side.select(*cols, f"1 AS {quote(own)}", f"0 AS {quote(seen)}").union(
        matched.select(*cols, f"0 AS {quote(own)}", f"1 AS {quote(seen)}")).group_by(
        *columns).agg(**{own: f"sum({quote(own)})", seen: f"sum({quote(seen)})"})
    return counted.select(
        *cols, f"CASE WHEN {quote(seen)} = 0 THEN {quote(own)} ELSE 0 END AS {quote(keep)}"
    ).repeat(keep)


def _number_after_grouping(q: exp.Select) -> exp.Select | None:
    """A grouped SELECT with a numbering column (``SELECT r, p, sum(x) AS s, RANK() OVER
    (PARTITION BY r ORDER BY sum(x) DESC) AS rk ... GROUP BY r, p``) as SQL evaluates it: the
    window numbers the grouped rows. Returned as the grouping in a subquery (its other columns
    plus the PARTITION BY and ORDER BY expressions as columns) numbered by the enclosing SELECT,
    which keeps the columns in their places and the ORDER BY ... LIMIT; None where ``q`` is not
    such a SELECT (``_ranked`` compiles or refuses it)."""
    windows = [e for e in q.expressions if any(e.find_all(exp.Window))]
    if len(windows) != 1 or q.args.get("distinct") is not None:
        return None
    item = windows[0]
    if not (isinstance(item, exp.Alias) and isinstance(item.this, exp.Window)):
        return None
    window = item.this
    others = [e for e in q.expressions if e is not item]
    grouped = (q.args.get("group") is not None or q.args.get("having") is not None
               or any(_aggregates(e) for e in [*others, window]))
    if not grouped or window.args.get("spec") or window.args.get("alias"):
        return None
    names = [e.alias if isinstance(e, exp.Alias) else e.name for e in others]
    if not all(isinstance(e, (exp.Alias, exp.Column)) and not isinstance(e.this, exp.Star)
               for e in others):
        return None  # a computed column without a name, or *: _items says so
    taken = [*names, item.alias]
    extra: list[exp.Expr] = []

    def key(e: exp.Expr, base: str) -> exp.Column:
        name = fresh_name(base, taken)
        taken.append(name)
        extra.append(exp.alias_(e.copy(), name, quoted=True))
        return exp.column(name, quoted=True)

    partition = [key(e, "partition_key") for e in window.args.get("partition_by") or []]
    order = window.args.get("order")
    ordered = [exp.Ordered(this=key(o.this, "order_key"), desc=o.args.get("desc"),
                           nulls_first=o.args.get("nulls_first"))
               for o in (order.expressions if order is not None else [])]
    inner = q.copy()
    copy_meta(q, inner)
    for arg in ("with_", "order", "limit", "offset"):
        inner.set(arg, None)  # the CTEs are in scope already; ORDER BY ... LIMIT is outside
    inner.set("expressions", [e for e in inner.expressions
                              if not any(e.find_all(exp.Window))] + extra)
    numbered = window.copy()
    copy_meta(window, numbered)
    numbered.set("partition_by", partition or None)
    numbered.set("order", exp.Order(expressions=ordered) if order is not None else None)
    columns: list[exp.Expr] = [
        exp.alias_(numbered, item.alias, quoted=True) if e is item
        else exp.column(e.alias if isinstance(e, exp.Alias) else e.name, quoted=True)
        for e in q.expressions]
    outer = exp.Select(expressions=columns).from_(
        exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(
            fresh_name("grouped", taken)))))
    for arg in ("order", "limit", "offset"):
        if q.args.get(arg) is not None:
            outer.set(arg, q.args[arg].copy())
    return outer


def copy_meta(original: exp.Expr, copy: exp.Expr) -> None:
    """Give each node of ``copy`` (a ``copy()`` of ``original``) its original's position in the
    SQL text, which error messages name."""
    for a, b in zip(original.walk(), copy.walk()):
        if a.meta and not b.meta:
            b.meta.update(a.meta)


def _conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    if node is None:
        return []
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _disjuncts(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.Paren):
        return _disjuncts(node.this)
    if isinstance(node, exp.Or):
        return _disjuncts(node.this) + _disjuncts(node.expression)
    return [node]


def _where_conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    """The conjuncts of a WHERE clause, with the conjuncts every branch of an OR has taken out
    of it: ``(a AND b) OR (a AND c)`` is ``a AND (b OR c)`` (also in SQL's three-valued logic),
    so a join key repeated in each branch is a join key, and a filter in each branch filters
    its table first."""
    out: list[exp.Expr] = []
    for conjunct in _conjuncts(node):
        branches = [_conjuncts(b) for b in _disjuncts(conjunct)]
        if len(branches) < 2:
            out.append(conjunct)
            continue
        texts = [{c.sql(dialect="spark") for c in branch} for branch in branches]
        common = set.intersection(*texts)
        if not common:
            out.append(conjunct)
            continue
        taken: set[str] = set()
        for c in branches[0]:
            text = c.sql(dialect="spark")
            if text in common and text not in taken:
                taken.add(text)
                out.append(c)
        rests = [[c for c in branch if c.sql(dialect="spark") not in common]
                 for branch in branches]
        if all(rests):  # else a branch is just the common part: the OR adds nothing
            out.append(exp.or_(*[exp.and_(*r) for r in rests]))  # copies keep positions
    return out


def _is_query(n: exp.Expr) -> bool:
    return isinstance(n, (exp.Subquery, exp.Select, exp.SetOperation))


def _own_nodes(node: exp.Expr) -> list[exp.Expr]:
    """The nodes of ``node`` outside its subqueries."""
    return list(node.walk(prune=lambda n: _is_query(n) and n is not node))


def _own_columns(node: exp.Expr) -> list[exp.Column]:
    return [n for n in _own_nodes(node)
            if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star)]


def _has_subquery(node: exp.Expr) -> bool:
    return any(_is_query(n) for n in _own_nodes(node))


def _with_select_aliases(condition: exp.Expr, by_alias: dict[str, exp.Expr],
                         in_from: Callable[[exp.Column], bool] | None = None) -> exp.Expr:
    """A HAVING condition whose unqualified names of the SELECT list's columns (outside
    aggregate calls, windows and subqueries) are their expressions, as Spark resolves HAVING
    (``HAVING total > 10`` after ``sum(amount) AS total``; inside ``max(amount)``, ``amount``
    is the table's column; the caller leaves out the names of grouping columns, which Spark
    resolves first; with ``in_from``, a name it says a table in FROM has is the table's: a
    SELECT item's lateral references to the items before it). The condition itself when it
    names none; else a copy, which errors locate as the original (its parent is the
    original's). The SELECT list's window columns are not taken."""

    def aliased(node: exp.Expr) -> exp.Expr | None:
        found = by_alias.get(node.name.lower()) if (
            isinstance(node, exp.Column) and not node.table
            and (in_from is None or not in_from(node))) else None
        if found is None or found.find(exp.Window) or (  # or the column itself, selected
                isinstance(found, exp.Column) and found.name.lower() == node.name.lower()):
            return None
        return found

    def references(node: exp.Expr) -> list[exp.Expr]:
        out = []
        for child in node.iter_expressions():
            if isinstance(child, (exp.AggFunc, exp.Window)) or _is_query(child):
                continue
            out += [child] if aliased(child) is not None else references(child)
        return out

    whole = aliased(condition)  # HAVING flag, of a boolean column the SELECT list names
    if whole is None and not references(condition):
        return condition
    # each replacement in parentheses: sqlglot renders the tree as it is (``s * 2`` with
    # ``s`` := ``a + b`` would read ``a + b * 2``)
    result = exp.Paren(this=whole.copy()) if whole is not None else condition.copy()
    for reference in references(result) if whole is None else []:
        replacement = aliased(reference)
        assert replacement is not None
        reference.replace(exp.Paren(this=replacement.copy()))
    result.parent = condition.parent
    return result


def _aggregates(node: exp.Expr) -> list[exp.Expr]:
    """The aggregate calls of ``node`` (outside subqueries; not those inside an aggregate)."""
    found: list[exp.Expr] = []

    def visit(n: exp.Expr) -> None:
        if isinstance(n, exp.AggFunc):
            found.append(n)
            return
        if _is_query(n) or isinstance(n, exp.Window):
            return
        for child in n.iter_expressions():
            visit(child)
    visit(node)
    return found


def _same_types(left: Collection, left_names: list[str], right: Collection,
                right_names: list[str]) -> bool:
    """Whether no pair of key columns is known to differ in type (the circuit's description
    says both types, ``column_types.known_columns``). Keys of different types are joined as
    fresh key columns the join widens, so each table's own column keeps its type."""
    columns = known_columns(left.circuit)
    left_types = dict(columns[left.node_id] or [])
    right_types = dict(columns[right.node_id] or [])
    return all(left_types.get(a) is None or right_types.get(b) is None
               or left_types[a] == right_types[b] for a, b in zip(left_names, right_names))
