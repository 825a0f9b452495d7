"""The core every other part speaks, torch-free: the one-line user error, the event base with its
JSON codec and migrations, the bounded reader of untrusted JSON and the escaping of untrusted text,
the cancel token, the settings machinery that turns dataclass fields into flags, checks and job
files, how a process stops on a signal, and how a process of one job imports its heavy modules
(frozen from the garbage collector). It names no experiment."""
