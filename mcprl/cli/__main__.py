"""`python -m mcprl.cli`: the same as the `mcprl` command."""

import sys

from mcprl.cli import main

sys.exit(main())
