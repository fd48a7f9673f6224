"""The `mcprl` command line: argument parsing and display only; every command calls the library.

mcprl tools SERVER [--json]
mcprl scenarios SERVER [-n N] -o FILE [--generator MODEL] [--grounded] [--seed N]
mcprl train SERVER [--scenarios FILE] [--steps N] ...      (see `mcprl train -h`)
mcprl eval SERVER --model NAME[@STEP] --model ... [--scenarios FILE]
mcprl report PROJECT/MODEL
mcprl autorl "TASK DESCRIPTION" [--server SERVER]
mcprl serve [--model M] [--port P]

Exit codes: 0 done, 1 an error (the message says what and how to fix it), 2 a usage error,
130 a run stopped by Ctrl-C (what was finished is saved; the same command resumes it).

The modules: `_options` (the run's settings, each declared once, and the flag of each setting
the library names), `_parser` (every command's options), `_display` (what is printed),
`_machine` (backend, device, threads), and one module per group of commands (`_train`,
`_eval`, `_commands`).
"""

from __future__ import annotations

import logging
import sys

from mcprl._memory import bound_allocator
from mcprl.cli._display import EXIT_INTERRUPTED, EXIT_USAGE
from mcprl.cli._options import FlagsFormatter, flags_for, server_of
from mcprl.cli._parser import build_parser
from mcprl.errors import MCPRLError, UsageError
from ruler import RulerError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    bound_allocator()  # before any thread starts: glibc fixes its arena limit early
    args = build_parser().parse_args(argv)
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig: only where nothing is set up yet
        handler = logging.StreamHandler()
        handler.setFormatter(FlagsFormatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO if args.verbose else logging.WARNING)
    # The MCP SDK logs each unparsable stdout line with a traceback; mcprl reports it itself.
    logging.getLogger("mcp.client.stdio").setLevel(logging.CRITICAL)
    # ... and each failed OAuth flow with a traceback; mcprl says what failed and the fix
    logging.getLogger("mcp.client.auth").setLevel(logging.CRITICAL)
    try:
        if hasattr(args, "header"):  # the server, with the headers and OAuth client to use
            args.server = server_of(args)
        return args.func(args)
    except (MCPRLError, RulerError, OSError) as exc:  # the error tree: one line
        print(f"mcprl: error: {flags_for(str(exc))}", file=sys.stderr)
        # a setting, flag or input that cannot be used exits as argparse's own errors do
        return EXIT_USAGE if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        print("mcprl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
