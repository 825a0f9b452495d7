"""dynamics' texts: a file's lines or the held-out corpus, taken in order up to --max-tokens; read by
the run and, before the load, by the memory plan (`DynamicsSettings.eval_source`). Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from engine.core.files import read_lines
from engine.data.text import clip_text, corpus, heldout_texts


class TextChoice(Protocol):
    """What of the settings names the texts (engine/experiments/dynamics/vocabulary.py DynamicsSettings)."""

    @property
    def text_file(self) -> str | None: ...


def dynamics_texts(settings: TextChoice) -> tuple[list[str], str]:
    """The texts and where they come from, in words."""
    if settings.text_file:
        return read_lines(Path(settings.text_file), "text file"), str(settings.text_file)
    held = corpus()
    return heldout_texts(held), f"held-out part of {held.source}"


def select_texts(tokenizer: Any, texts: Sequence[str], max_tokens: int, max_length: int) -> list[str]:
    """Texts in order until their tokens (each cut at max_length) reach max_tokens; at least one."""
    chosen: list[str] = []
    total = 0
    for text in texts:
        text = clip_text(tokenizer, text, max_length)  # a line of 60 MB: never tokenized whole to be truncated
        n = len(tokenizer(text, truncation=True, max_length=max_length)["input_ids"])
        if chosen and total + n > max_tokens:
            break
        chosen.append(text)
        total += n
    return chosen
