"""One module per `anatomy-tui run` experiment: `add_arguments(parser)` and `main(args) -> int`.

Modules here import nothing heavy at import time, so `anatomy-tui --help` stays instant.
"""
