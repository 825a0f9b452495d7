"""Text that needs no download: the project's own evaluation sentences and a training corpus made
from the English documentation CPython ships (`pydoc_data.topics`), split deterministically."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.files import read_lines

if TYPE_CHECKING:
    import torch

NO_TOKENS = ("the evaluation texts leave no token to predict (a text needs at least two tokens); "
             "use longer texts or a larger --max-length")

# Ten sentences of different kinds (narrative, science, news, dialogue, instructions, lists,
# history, health, code, nature), like the paper's ten diverse English sentences.
PAPER_SUBSET = (0, 4, 8, 12, 16, 20, 24, 28, 32, 36)
EVAL_SETS = ("full", "paper")
HELDOUT_EVERY = 5  # every fifth pydoc topic (in sorted order) is held out
# The most text a run reads from an evaluation or calibration source without a bound (--max-tokens,
# --max-windows of --eval-dataset): 64 MiB of characters, a few times WikiText-103's test split. A file
# over it is refused before it is read, a dataset read through `datasets` once it holds more; with a
# bound, reading stops where the bound is met (engine/data/dataset_texts.py).
TOKENIZE_CHUNK = 2**20  # characters tokenized at a time
SLACK = 64  # tokens read past what a bound needs: the last tokens of a text cut short may change with what follows
CHARS_PER_TOKEN = 16  # characters a token covers at most, generously (English averages 4): `text_bound`


def text_bound(tokens: int) -> int:
    """The characters a text is cut to before it is tokenized when only `tokens` of its tokens are
    kept: a 1 MB prompt for a context of 8,192 tokens is tokenized as its last 132 K characters. A
    text whose tokens cover more than CHARS_PER_TOKEN characters each keeps fewer tokens than asked."""
    return CHARS_PER_TOKEN * tokens + 1024


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


# --- tokenizing long text in bounded pieces ----------------------------------------------------


def token_ids(tokenizer: Any, text: str, wanted: int | None = None, add_special_tokens: bool = True) -> Any:
    """The ids of `text` as `tokenizer(text)` gives them (the first `wanted` of them), tokenized
    TOKENIZE_CHUNK characters at a time (a tokenizer's encoding of 64 MB takes gigabytes): with
    `wanted`, longer and longer beginnings until two agree on their first `wanted` ids; else the
    text in pieces cut at a space between two words, where every tokenizer's pre-tokenization
    splits. An array of ids (8 bytes each)."""
    from array import array

    def encode(part: str, special: bool) -> list[int]:
        ids: list[int] = tokenizer(part, add_special_tokens=special)["input_ids"]
        return ids

    if wanted is not None:
        return array("q", stable_prefix(tokenizer, text, wanted, add_special_tokens)[1][:wanted])
    if len(text) <= TOKENIZE_CHUNK:
        return array("q", encode(text, add_special_tokens))
    head, tail = _special_ends(tokenizer) if add_special_tokens else ([], [])
    ids, start = array("q", head), 0
    while start < len(text):
        end = _word_boundary(text, start + TOKENIZE_CHUNK) if start + TOKENIZE_CHUNK < len(text) else len(text)
        ids.extend(encode(text[start:end], False))
        start = end
    ids.extend(tail)
    return ids


def stable_prefix(tokenizer: Any, text: str, wanted: int, add_special_tokens: bool = True) -> tuple[int, list[int]]:
    """(n, ids of text[:n]): the shortest beginning tried (4 x wanted + 1024 characters, then
    doubled, up to `text_bound(wanted)`) whose first `wanted` ids a beginning twice as long agrees
    with, so they are the whole text's (n is the text's length when it is short)."""
    bound = min(len(text), text_bound(wanted))
    size = min(bound, 4 * wanted + 1024)
    ids = tokenizer(text[:size], add_special_tokens=add_special_tokens)["input_ids"]
    while size < bound:
        longer = min(bound, 2 * size)
        more = tokenizer(text[:longer], add_special_tokens=add_special_tokens)["input_ids"]
        if len(ids) > wanted + 8 and more[:wanted] == ids[:wanted]:
            break
        size, ids = longer, more
    return size, ids


def clip_text(tokenizer: Any, text: str, max_length: int) -> str:
    """The text cut to a beginning that holds its first `max_length` tokens (and SLACK more), so a
    line of 60 MB is never tokenized whole only to be truncated (a fast tokenizer's encoding of it
    takes gigabytes); the ids truncation to `max_length` gives are unchanged."""
    return text[: stable_prefix(tokenizer, text, max_length + SLACK, False)[0]]


def clip_texts(tokenizer: Any, texts: Sequence[str], max_length: int) -> tuple[str, ...]:
    """`clip_text` of each text."""
    return tuple(clip_text(tokenizer, text, max_length) for text in texts)


_BOUNDARY = re.compile(r"(?<=[A-Za-z0-9]) (?=[A-Za-z])")  # " word" after a word: a new pre-token everywhere


def _word_boundary(text: str, near: int) -> int:
    """A cut at or after `near` before a space between two words (the end when there is none
    within another chunk's length)."""
    found = _BOUNDARY.search(text, near, near + TOKENIZE_CHUNK)
    return found.start() if found else min(len(text), near + TOKENIZE_CHUNK)


def _special_ends(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after a text (a BOS, an EOS), found on a probe text."""
    plain = tokenizer("probe", add_special_tokens=False)["input_ids"]
    full = tokenizer("probe", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    return [], []


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

    train: list[str] = []
    heldout: list[str] = []
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


def token_blocks(tokenizer: Any, text: str, block_size: int, max_blocks: int | None = None) -> torch.Tensor:
    """The text tokenised once and cut into equal blocks: a LongTensor [n_blocks, block_size]."""
    import torch

    ids = token_ids(tokenizer, text, block_size * max_blocks if max_blocks else None, add_special_tokens=False)
    n = len(ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    if n == 0:
        raise UserError(f"training text too short: fewer than {block_size} tokens; give a longer --train-file")
    return torch.tensor(ids[: n * block_size].tolist(), dtype=torch.long).view(n, block_size)
