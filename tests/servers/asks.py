"""A test MCP server whose tool asks the user a question mid-call (MCP elicitation).

python tests/servers/asks.py        # stdio
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import Context, make_server, serve

server = make_server("asks", instructions="Books tables; asks the user for the time.")


class BookingTime(BaseModel):
    time: str = Field(default="19:00", description="when, as HH:MM")


class Confirmation(BaseModel):
    confirm: bool = Field(description="book it for sure")


@server.tool()
async def book_table(people: int, ctx: Context) -> str:
    """Book a table for `people`; the user is asked for the time."""
    answer = await ctx.elicit(f"What time should the table for {people} be?", schema=BookingTime)
    if answer.action != "accept":
        return f"not booked: the user did not give a time ({answer.action})"
    return f"booked a table for {people} at {answer.data.time}"


@server.tool()
async def cancel_booking(name: str, ctx: Context) -> str:
    """Cancel the booking under `name`; the user must confirm (no default)."""
    answer = await ctx.elicit(f"Cancel the booking of {name}?", schema=Confirmation)
    if answer.action == "accept" and answer.data.confirm:
        return f"cancelled the booking of {name}"
    return f"kept the booking of {name}"


@server.tool()
async def summarize(text: str, ctx: Context) -> str:
    """Summarize `text` with the client's model (MCP sampling)."""
    from mcp import types

    try:
        reply = await ctx.request_context.session.create_message(
            [types.SamplingMessage(role="user", content=types.TextContent(type="text", text=text))],
            max_tokens=50,
        )
    except Exception as exc:  # the client refused or failed
        return f"no summary: {exc}"
    return f"summary: {reply.content.text}"


if __name__ == "__main__":
    serve(server)
