"""The console (Textual): a thin layer over the engine and the store; started by the command line
(cli/launch.py), which it uses only to start a job (cli/argv.py, cli/flags.py)."""
