"""The command line: `anatomy-tui` (cli/main.py: the parser and its dispatch), a front end of its
own beside the notebook API (anatomy_tui/) and the console (tui/). `anatomy-tui run EXPERIMENT`
(cli/runner.py, the one run path), the flags made from the Settings (cli/flags.py), a run's command
line rebuilt from data (cli/argv.py), printers, and the headless commands (cli/commands/: sessions,
export, atlas, compare, report); with no command it starts the console (cli/launch.py).
"""
