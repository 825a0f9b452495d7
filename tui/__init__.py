"""Front ends: the Textual console and the command line, both thin layers over the engine."""
