"""What a run leaves on disk, below the store: atomic writes (a crash never leaves half a file), a
set of files staged and moved in whole (staging.py: the report), and the names of a session
folder's parts, so the engine, the store and the console agree."""
