"""Computation for anatomy-tui: models, layer access, perplexity and experiments.

Nothing here imports textual or rich, so the engine runs on a headless box.
"""
