"""The query a person would write for a question about a SQL listing.

The generator reads a table whole (`SELECT * FROM orders LIMIT 200`) and asks about what came
back: 'How many orders have status "pending"?'. Kept as the reference, that listing asks the
model to count rows of a JSON dump in its head, which no call makes easier; a person asks the
database instead:

    direct_query("SELECT * FROM orders LIMIT 200", Ask("count", where=(("status", "pending"),)))
    -> "SELECT COUNT(*) FROM orders WHERE status = 'pending'"

whose result (`[{'COUNT(*)': 1}]`) is the answer. The generator runs it on the server and keeps
it as the reference only when `reads_answer` finds the question's answer in what it returned.
"""

from __future__ import annotations

import re
from typing import Any

from mcprl.scenarios._answers import equals_as_written, is_number
from mcprl.scenarios._questions import Ask

__all__ = ["direct_query", "reads_answer"]

_TABLE = re.compile(r"^\s*SELECT\s+\*\s+FROM\s+([\"`\[]?)(\w+)[\"`\]]?(?:\s+LIMIT\s+\d+)?\s*;?\s*$",
                    re.IGNORECASE)  # fmt: skip
_PLAIN = re.compile(r"[A-Za-z_]\w*")


def _name(name: str) -> str:
    return name if _PLAIN.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def _value(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return None


def direct_query(listing: str, ask: Ask) -> str | None:
    """The query that reads just what `ask` asks of the table `listing` reads whole; None when
    the listing is not a plain read of one table or a value cannot be written in SQL."""
    m = _TABLE.match(listing)
    if m is None:
        return None
    table = m.group(2)
    if ask.read == "count":
        what = "COUNT(*)"
    elif ask.field is None:
        return None
    elif ask.read == "sum":
        what = f"SUM({_name(ask.field)})"
    else:
        what = _name(ask.field)
    sql = f"SELECT {what} FROM {_name(table)}"
    conditions = []
    for field, value in ask.where:
        literal = _value(value)
        if literal is None:
            return None
        conditions.append(f"{_name(field)} = {literal}")
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    if ask.order is not None:
        sql += f" ORDER BY {_name(ask.order[0])} {ask.order[1]} LIMIT 1"
    return sql


def _one_value(data: Any) -> Any:
    """The single value of a result of one row of one column (`[{'COUNT(*)': 1}]`: 1)."""
    while isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict) and len(data) == 1:
        data = next(iter(data.values()))
    return data if isinstance(data, (str, int, float)) and not isinstance(data, bool) else None


def reads_answer(data: Any, read: str, answer: str) -> bool:
    """Whether a query's result (parsed) says `answer`: its one value equals it, to the
    precision the answer is written in; for an existence question ("yes" or "no") a count,
    positive or zero."""
    value = _one_value(data)
    if value is None:
        return False
    if answer in ("yes", "no") and read == "count" and is_number(value):
        return (float(value) > 0) == (answer == "yes")
    if is_number(answer) and is_number(value):
        return equals_as_written(float(value), answer)
    return str(value).strip() == answer.strip()
