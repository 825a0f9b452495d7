"""Text that needs no download: the project's own evaluation sentences and a training corpus made
from the English documentation CPython ships (`pydoc_data.topics`), split deterministically."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from engine.core.errors import UserError
from engine.core.files import read_lines

NO_TOKENS = ("the evaluation texts leave no token to predict (a text needs at least two tokens); "
             "use longer texts or a larger --max-length")

# Ten sentences of different kinds (narrative, science, news, dialogue, instructions, lists,
# history, health, code, nature), like the paper's ten diverse English sentences.
PAPER_SUBSET = (0, 4, 8, 12, 16, 20, 24, 28, 32, 36)
EVAL_SETS = ("full", "paper")
HELDOUT_EVERY = 5  # every fifth pydoc topic (in sorted order) is held out


def builtin_eval_sentences() -> list[str]:
    text = resources.files("engine").joinpath("data/eval_sentences.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def eval_texts(path: Path | None = None, subset: str = "full") -> list[str]:
    """The evaluation texts: a user's file, or the built-in set ('full' or the 10-sentence 'paper')."""
    if path is not None:
        return read_lines(path, "evaluation file")
    sentences = builtin_eval_sentences()
    if subset == "full":
        return sentences
    if subset == "paper":
        return [sentences[i] for i in PAPER_SUBSET]
    raise UserError(f"unknown evaluation set {subset!r}; use one of {', '.join(EVAL_SETS)}")


@dataclass(frozen=True)
class Corpus:
    """Training text and held-out text that never overlap."""

    train: str
    heldout: str
    source: str


def _paragraphs(text: str) -> list[str]:
    parts = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
    return [p for p in parts if len(p) > 80]


def builtin_corpus() -> Corpus:
    from pydoc_data.topics import topics

    train, heldout = [], []
    for i, key in enumerate(sorted(topics)):
        (heldout if i % HELDOUT_EVERY == 0 else train).extend(_paragraphs(topics[key]))
    return Corpus("\n\n".join(train), "\n\n".join(heldout), "pydoc_data.topics (CPython documentation)")


def corpus(train_file: Path | None = None) -> Corpus:
    """The built-in corpus, or a user's text split 90/10 by paragraph (every tenth held out)."""
    if train_file is None:
        return builtin_corpus()
    paragraphs = read_lines(train_file, "training file")
    if len(paragraphs) < 2:
        raise UserError(f"training file {train_file} needs at least two lines (one is held out)")
    heldout = paragraphs[::10]
    train = [p for i, p in enumerate(paragraphs) if i % 10]
    return Corpus("\n".join(train), "\n".join(heldout), str(train_file))


def heldout_texts(corpus_: Corpus, n: int | None = None) -> list[str]:
    texts = [p for p in corpus_.heldout.split("\n\n" if "\n\n" in corpus_.heldout else "\n") if p.strip()]
    return texts[:n] if n is not None else texts


def token_blocks(tokenizer, text: str, block_size: int, max_blocks: int | None = None):
    """The text tokenised once and cut into equal blocks: a LongTensor [n_blocks, block_size]."""
    import torch

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    n = len(ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    if n == 0:
        raise UserError(f"training text too short: fewer than {block_size} tokens; give a longer --train-file")
    return torch.tensor(ids[: n * block_size], dtype=torch.long).view(n, block_size)
