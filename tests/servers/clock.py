"""A test MCP server like third-party time servers: arguments that need a particular form (an
IANA time-zone name, given only as an example in the description), failures reported as plain
text without the error flag, and a tool whose answer changes from call to call.

python tests/servers/clock.py       # stdio
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import make_server, serve

server = make_server("clock", instructions="Current times and time-zone conversions.")


def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


@server.tool()
def get_current_time(timezone: str) -> str:
    """Get the current time in a time zone.

    timezone: an IANA time-zone name, e.g. 'America/New_York' or 'Asia/Tokyo'.
    """
    zone = _zone(timezone)
    if zone is None:  # reported as text, like many servers do: no error flag
        return f"Error: Invalid timezone: {timezone!r}"
    return datetime.now(zone).isoformat(timespec="microseconds")


@server.tool()
def convert_time(time: str, source_timezone: str, target_timezone: str) -> str:
    """Convert a wall-clock time between time zones (on 2024-06-01).

    time: 24-hour HH:MM, e.g. '14:30'. source_timezone, target_timezone: IANA names such as
    'Europe/London' or 'Australia/Sydney'.
    """
    source, target = _zone(source_timezone), _zone(target_timezone)
    if source is None or target is None:
        return f"Error: Invalid timezone: {source_timezone!r} or {target_timezone!r}"
    try:
        hours, minutes = (int(x) for x in time.split(":"))
        start = datetime(2024, 6, 1, hours, minutes, tzinfo=source)
    except ValueError:
        return f"Error: Invalid format for time {time!r}: expected HH:MM"
    return start.astimezone(target).strftime("%H:%M")


if __name__ == "__main__":
    serve(server)
