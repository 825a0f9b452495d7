"""`python -m cli`: the `anatomy-tui` command."""

import sys

from cli.main import main

sys.exit(main())
