"""The core every other part speaks, torch-free: the one-line user error, the event base with its
JSON codec and migrations, the cancel token, the settings machinery that turns dataclass fields
into flags, checks and job files, and how a process stops on a signal. It names no experiment."""
