"""A test MCP server like third-party calculators and unit converters: each takes one free-text
argument, an arithmetic expression or a conversion in the form its description shows.

python tests/servers/calc.py        # stdio
"""

from __future__ import annotations

import ast
import operator
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import ToolError, make_server, serve

server = make_server("calc", instructions="Arithmetic and unit conversion.")

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg}  # fmt: skip


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("unsupported")


@server.tool()
def calculate(expression: str) -> str:
    """Calculates/evaluates the given expression."""
    try:
        return str(_eval(ast.parse(expression, mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        raise ToolError(f"cannot evaluate {expression!r}: {exc}") from None


_METRES = {"m": 1.0, "km": 1000.0, "cm": 0.01, "mi": 1609.344, "ft": 0.3048}


@server.tool()
def convert(expression: str) -> str:
    """Convert a length, written like '5 m to km'."""
    m = re.fullmatch(r"\s*([\d.]+)\s*(\w+)\s+to\s+(\w+)\s*", expression)
    if not m or m.group(2) not in _METRES or m.group(3) not in _METRES:
        raise ToolError(f"cannot read {expression!r}: write it like '5 m to km'")
    value = float(m.group(1)) * _METRES[m.group(2)] / _METRES[m.group(3)]
    return f"{m.group(1)} {m.group(2)} = {value:g} {m.group(3)}"


if __name__ == "__main__":
    serve(server)
