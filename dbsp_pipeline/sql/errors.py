"""The error of SQL that cannot become a circuit: where in the text, what, and what to do.

Every refusal of ``dbsp_pipeline.sql`` is a ``SqlError`` (a ``CircuitError``): it names the
view being compiled, the line and column of the offending part of the SQL text (as sqlglot
located it), what is not supported or wrong, and a hint. Nothing is declared on the circuit by a
statement that fails (see ``script``).
"""

from __future__ import annotations

from sqlglot import exp

from dbsp_pipeline.errors import CircuitError


class SqlError(CircuitError):
    """SQL text the compiler refuses. ``view``, ``line`` and ``column`` locate it (``line`` and
    ``column`` are 1-based, None when sqlglot gave no position)."""

    def __init__(self, view: str, node: exp.Expr | None, problem: str,
                 hint: str = "") -> None:
        self.view = view
        self.line, self.column = position(node)
        self.problem = problem
        self.hint = hint
        where = (f" at line {self.line}, column {self.column}" if self.line is not None
                 else "")
        text = f"view '{view}'{where}: {problem}"
        if node is not None:
            text += f" (in: {_snippet(node)})"
        if hint:
            text += f". Hint: {hint}"
        super().__init__(text)


def position(node: exp.Expr | None) -> tuple[int | None, int | None]:
    """Where ``node`` starts in the text: the first of the positions sqlglot recorded for it
    and its descendants, else its nearest located ancestor's."""
    if node is None:
        return None, None
    located = [_start(n) for n in node.walk() if n.meta.get("line") is not None]
    if located:
        return min(located)
    parent = node.parent
    while parent is not None:
        if parent.meta.get("line") is not None:
            return _start(parent)
        parent = parent.parent
    return None, None


def _start(node: exp.Expr) -> tuple[int, int]:
    """sqlglot's ``col`` is where the token ends; the token's first character is reported."""
    meta = node.meta
    width = int(meta.get("end", 0)) - int(meta.get("start", 0))
    return int(meta["line"]), max(1, int(meta["col"]) - width)


def _snippet(node: exp.Expr, limit: int = 80) -> str:
    text = " ".join(node.sql(dialect="spark").split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
