"""`anatomy-tui sessions`; the `run` commands come from the experiment registry (tui/runner.py)."""
