"""`python -m mcprl`: the `mcprl` command."""

import sys

from mcprl.cli import main

sys.exit(main())
