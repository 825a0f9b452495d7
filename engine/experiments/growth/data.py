"""The training corpus, a character tokenizer and deterministic batches.

Corpus: the project's built-in one from `engine.data.text.corpus` (the paragraphs of CPython's
`pydoc_data.topics`, the reference manual's topic pages, whitespace collapsed; every fifth topic
in sorted order is held out and serves as validation, so no page is in both halves), or a user's
UTF-8 file, one paragraph a line, every tenth line held out.

Tokenizer: one token per character. The vocabulary is every character of the corpus, sorted,
after id 0, which stands for any character not in it (about 100 ids for pydoc topics). A small
vocabulary keeps the embedding tables tiny, so nearly all parameters sit in the layers whose
widths the experiment varies.

Batches: step s of seed k reads windows at offsets drawn from a generator seeded with (k, s),
so every arm of a seed sees the same data in the same order, and a resumed run the same data
it would have seen without the interruption.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.core.errors import UserError

TOKENIZER_FILE = "growth_tokenizer.json"
UNK = 0


@dataclass(frozen=True)
class CharTokenizer:
    """Characters to ids and back; unknown characters map to id 0 and decode to U+FFFD."""

    chars: str

    @property
    def vocab_size(self) -> int:
        return len(self.chars) + 1

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    def encode(self, text: str) -> list[int]:
        index = {c: i + 1 for i, c in enumerate(self.chars)}
        return [index.get(c, UNK) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i - 1] if 0 < i <= len(self.chars) else "\ufffd" for i in ids)

    def transformers(self) -> Any:
        """The same ids as a transformers tokenizer (what lm-eval's HFLM takes): one token per
        character, id 0 for any other character and as the end of text (a growth model has none)."""
        from tokenizers import Tokenizer, decoders, models
        from transformers import PreTrainedTokenizerFast

        vocab = {"\ufffd": UNK} | {c: i + 1 for i, c in enumerate(self.chars) if c != "\ufffd"}
        core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="\ufffd"))
        core.decoder = decoders.Fuse()
        return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="\ufffd", eos_token="\ufffd",
                                       clean_up_tokenization_spaces=False)

    def save(self, folder: Path) -> None:
        from engine.disk.atomic import atomic_write_json

        atomic_write_json(Path(folder) / TOKENIZER_FILE, {"type": "char", "unk_id": UNK, "chars": self.chars})

    @classmethod
    def load(cls, folder: Path) -> CharTokenizer:
        path = Path(folder) / TOKENIZER_FILE
        if not path.exists():
            raise UserError(f"{folder} has no {TOKENIZER_FILE}; it is not a growth model folder")
        from engine.disk.atomic import read_json

        return cls(read_json(path)["chars"])


@dataclass(frozen=True)
class Corpus:
    """Token ids of the train and validation halves, and the tokenizer that made them."""

    train: torch.Tensor
    val: torch.Tensor
    tokenizer: CharTokenizer
    source: str


def load_corpus(train_file: str | None = None) -> Corpus:
    """The project's corpus (`engine.data.text.corpus`): its train half and its held-out half."""
    from engine.data.text import corpus

    text = corpus(Path(train_file) if train_file else None)
    train, val, source = text.train, text.heldout, text.source
    tokenizer = CharTokenizer.from_text(train + val)

    def as_ids(part: str) -> torch.Tensor:
        return torch.tensor(tokenizer.encode(part), dtype=torch.long)

    return Corpus(as_ids(train), as_ids(val), tokenizer, source)


def train_batch(tokens: torch.Tensor, seed: int, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
    """`batch_size` windows of `seq_len + 1` tokens for global step `step` of seed `seed`."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([tokens[s : s + seq_len + 1] for s in starts.tolist()])


def val_batches(tokens: torch.Tensor, n_batches: int, batch_size: int, seq_len: int) -> list[torch.Tensor]:
    """A fixed validation set: windows spread evenly over the validation text."""
    count = n_batches * batch_size
    last = len(tokens) - seq_len - 1
    if last < 0:
        raise UserError(f"validation text has {len(tokens)} tokens; it needs more than seq_len={seq_len}")
    starts = torch.linspace(0, last, count).long().tolist()
    windows = torch.stack([tokens[s : s + seq_len + 1] for s in starts])
    return list(windows.split(batch_size))
