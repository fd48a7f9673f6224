"""Calculator: arithmetic, powers and roots, and unit conversions, as MCP tools.

python examples/servers/calculator.py            # stdio
python examples/servers/calculator.py --http 8001
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).parent))
from _compat import READS, ToolError, make_server, serve

server = make_server(
    "calculator",
    instructions="Exact arithmetic, powers and roots, and unit conversions. Results are numbers.",
)

Unit = Literal["m", "km", "cm", "mm", "mile", "ft", "inch", "kg", "g", "lb", "oz", "C", "F", "K"]

# Length in metres and mass in kilograms per unit; temperatures are converted by formula.
_LENGTH = {"m": 1.0, "km": 1000.0, "cm": 0.01, "mm": 0.001, "mile": 1609.344, "ft": 0.3048}
_LENGTH["inch"] = 0.0254
_MASS = {"kg": 1.0, "g": 0.001, "lb": 0.45359237, "oz": 0.028349523125}
_TEMP = ("C", "F", "K")


def _num(x: float) -> float:
    """Round away binary noise (0.1 + 0.2) so answers read as people write them."""
    if math.isinf(x) or math.isnan(x):
        raise ToolError("the result is not a finite number")
    r = round(float(x), 10)
    return int(r) if r.is_integer() and abs(r) < 2**53 else r


@server.tool(annotations=READS)
def add(a: float, b: float) -> float:
    """Add two numbers: a + b."""
    return _num(a + b)


@server.tool(annotations=READS)
def subtract(a: float, b: float) -> float:
    """Subtract b from a: a - b."""
    return _num(a - b)


@server.tool(annotations=READS)
def multiply(a: float, b: float) -> float:
    """Multiply two numbers: a * b."""
    return _num(a * b)


@server.tool(annotations=READS)
def divide(a: float, b: float) -> float:
    """Divide a by b: a / b. b must not be zero."""
    if b == 0:
        raise ToolError("division by zero: b must not be 0")
    return _num(a / b)


@server.tool(annotations=READS)
def power(base: float, exponent: float) -> float:
    """Raise base to the power exponent: base ** exponent."""
    try:
        return _num(math.pow(base, exponent))
    except (OverflowError, ValueError) as exc:
        raise ToolError(f"cannot compute {base} ** {exponent}: {exc}") from None


@server.tool(annotations=READS)
def root(x: float, n: int = 2) -> float:
    """The n-th root of x (square root by default). Odd roots of negative numbers are allowed."""
    if n == 0:
        raise ToolError("n must not be 0")
    if x < 0 and n % 2 == 0:
        raise ToolError(f"an even root ({n}) of a negative number ({x}) is not real")
    value = math.copysign(abs(x) ** (1.0 / n), x)
    nearest = round(value)
    if nearest**n == x:  # exact roots stay exact: root(27, 3) is 3, not 3.0000000000000004
        value = nearest
    return _num(value)


@server.tool(annotations=READS)
def convert_units(value: float, from_unit: Unit, to_unit: Unit) -> float:
    """Convert a value between units of length (m, km, cm, mm, mile, ft, inch), mass (kg, g, lb,
    oz) or temperature (C, F, K)."""
    for table in (_LENGTH, _MASS):
        if from_unit in table and to_unit in table:
            return _num(value * table[from_unit] / table[to_unit])
    if from_unit in _TEMP and to_unit in _TEMP:
        kelvin = {"C": value + 273.15, "F": (value - 32) * 5 / 9 + 273.15, "K": value}[from_unit]
        out = {"C": kelvin - 273.15, "F": (kelvin - 273.15) * 9 / 5 + 32, "K": kelvin}[to_unit]
        return _num(out)
    raise ToolError(f"cannot convert {from_unit} to {to_unit}: they measure different things")


@server.resource("units://supported", mime_type="text/plain")
def supported_units() -> str:
    """The units convert_units understands, by quantity."""
    return (
        f"length: {', '.join(_LENGTH)}\nmass: {', '.join(_MASS)}\ntemperature: {', '.join(_TEMP)}"
    )


if __name__ == "__main__":
    serve(server)
