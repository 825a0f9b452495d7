"""`anatomy-tui sessions`; the `run` commands come from the experiment registry (cli/runner.py)."""
