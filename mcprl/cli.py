"""The `mcprl` command line: argument parsing only; every command calls the library."""

from __future__ import annotations

import argparse
import sys

from mcprl import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mcprl",
        description="Train open models to use any MCP server's tools. "
        "For judging groups of trajectories, see the `ruler` command.",
    )
    p.add_argument("--version", action="version", version=f"mcprl {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    _parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
