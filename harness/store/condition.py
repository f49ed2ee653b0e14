"""`parse_condition`: a user's filter (`harness history --where …`) as SQL the harness wrote, never theirs.

Why parse rather than concatenate: text pasted into a query can close its parenthesis and add a
`UNION ALL SELECT …`, an `OR` that escapes the harness's own filters, or a subquery on `read_text`.
So the text is parsed by DuckDB's own parser (`json_serialize_sql` of `SELECT * FROM <view> WHERE
<text>`), the tree is checked to be one plain SELECT of that view whose WHERE is a boolean expression
of a small grammar — the view's columns, literals, comparisons, AND/OR/NOT, IN (a list), BETWEEN,
LIKE/ILIKE, IS [NOT] NULL, CAST, arithmetic and a few string functions — and DuckDB renders that
tree back to SQL (`json_deserialize_sql`). What runs is that rendering, used as a subquery, so nothing
of the text reaches the query except through a tree the grammar allowed.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import duckdb

from harness.store.errors import StoreError, one_line, one_row

_CLASSES = {"COLUMN_REF", "CONSTANT", "COMPARISON", "CONJUNCTION", "OPERATOR", "BETWEEN", "CAST", "FUNCTION"}
_OPERATORS = {"OPERATOR_NOT", "OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL", "COMPARE_IN", "COMPARE_NOT_IN",
              "OPERATOR_COALESCE"}
_FUNCTIONS = {
    "~~", "!~~", "~~*", "!~~*", "+", "-", "*", "/", "%",  # LIKE, NOT LIKE, ILIKE, NOT ILIKE; arithmetic
    "lower", "upper", "length", "abs", "round", "prefix", "suffix", "contains", "starts_with", "regexp_matches",
}
GRAMMAR = ("columns, literals, = <> < > <= >=, AND/OR/NOT, IN (…), BETWEEN, LIKE/ILIKE, IS [NOT] NULL, CAST, "
           "+ - * /, lower/upper/length/abs/round/prefix/suffix/contains/starts_with/regexp_matches")


def parse_condition(con: duckdb.DuckDBPyConnection, text: str, view: str, columns: Iterable[str],
                    option: str = "--where") -> str:
    """`SELECT * FROM view WHERE …` rendered by DuckDB from `text` once it passed the grammar; StoreError
    (one line, naming `option`) for anything else. `columns`: the names the condition may use."""
    if not text.strip():
        raise StoreError(f"{option} is empty: give a condition such as \"task = 'gsm8k'\"")
    sql = f"SELECT * FROM {view} WHERE {text}\n"  # the newline ends a trailing `--` comment
    try:
        tree = json.loads(one_row(con.execute("SELECT json_serialize_sql(?)", [sql]), option)[0])
    except duckdb.Error as exc:
        raise StoreError(f"{option}: cannot parse the condition: {one_line(exc)}") from exc
    if tree.get("error"):
        raise StoreError(f"{option} takes one condition over {view} columns: "
                         f"{tree.get('error_message', 'not a condition')}")
    statements = tree["statements"]
    node = statements[0]["node"] if len(statements) == 1 else {}
    source = node.get("from_table") or {}
    plain = (node.get("type") == "SELECT_NODE" and not node.get("modifiers") and not node["cte_map"]["map"]
             and source.get("type") == "BASE_TABLE" and source.get("table_name") == view
             and not node.get("group_expressions") and node.get("having") is None and node.get("qualify") is None
             and node.get("sample") is None and len(node.get("select_list", [])) == 1)
    if not plain or node.get("where_clause") is None:
        raise StoreError(f"{option} takes one condition over {view} columns, not a query or a second statement")
    _check(node["where_clause"], set(columns), option, view)
    return one_row(con.execute("SELECT json_deserialize_sql(?)", [json.dumps(tree)]), option)[0]


def _check(expr: dict[str, Any], columns: set[str], option: str, view: str) -> None:
    kind, subtype = expr.get("class"), expr.get("type")
    if kind not in _CLASSES:
        raise StoreError(f"{option}: {_what(kind)} is not allowed; a condition uses {GRAMMAR}")
    if kind == "COLUMN_REF":
        name = expr["column_names"][-1] if len(expr["column_names"]) == 1 else ".".join(expr["column_names"])
        if name not in columns:
            raise StoreError(f"{option}: unknown column {_short(name)}; {view} has {', '.join(sorted(columns))}")
    elif kind == "OPERATOR" and subtype not in _OPERATORS:
        raise StoreError(f"{option}: operator {subtype} is not allowed; a condition uses {GRAMMAR}")
    elif kind == "FUNCTION":
        name = expr.get("function_name", "")
        if name not in _FUNCTIONS or expr.get("schema") or expr.get("catalog") or expr.get("filter") is not None \
                or expr.get("distinct") or expr.get("order_bys", {}).get("orders"):
            raise StoreError(f"{option}: function {_short(name)} is not allowed; a condition uses {GRAMMAR}")
    for child in _children(expr):
        _check(child, columns, option, view)


def _children(expr: dict[str, Any]):
    for key in ("left", "right", "child", "input", "lower", "upper"):
        if isinstance(expr.get(key), dict):
            yield expr[key]
    for child in expr.get("children", []):
        yield child
    for argument in expr.get("arguments", []):
        yield argument.get("expression", argument)


def _what(kind: str | None) -> str:
    return {"SUBQUERY": "a subquery", "STAR": "*", "WINDOW": "a window function", "CASE": "CASE",
            "PARAMETER": "a parameter", "LAMBDA": "a lambda"}.get(kind or "", f"expression {kind}")


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")
