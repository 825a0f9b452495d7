"""The family's text: one corpus, one tokenizer, one held-out split, the same for every member.

The corpus: the package's text (engine.data.text.corpus: CPython's pydoc topics, every fifth topic
held out) or `--corpus`, any source engine.data.dataset_texts reads (a local .txt, .jsonl,
.parquet file or folder, a hub dataset), every tenth text held out. The tokenizer: one id per
character of the corpus (growth's CharTokenizer) for the default Llama-style family, or the
tokenizer of `--model`. The held-out windows are fixed: `--eval-windows` windows of `--context` + 1
tokens spread evenly over the held-out text (growth's val_batches), read by every member's held-out
loss and anatomy.

A corpus too small is refused in one line before any training: the held-out text must hold its
windows without overlap, and the training text at least the largest token budget (each member
sees its text at most once, so the loss against depth is not a loss against repetition).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.core.errors import UserError
from engine.data.text import HELDOUT_EVERY, corpus, token_ids
from engine.experiments.depth_family.vocabulary import DepthFamilySettings
from engine.experiments.growth.data import CharTokenizer, val_batches

CORPUS_HELDOUT_EVERY = 10  # --corpus: every tenth text held out


@dataclass(frozen=True)
class FamilyText:
    """Token ids of the training text, the held-out windows [windows, context + 1], the tokenizer
    (a transformers one: the anatomy's evaluator reads it) and what the recipe says of them."""

    train: torch.Tensor
    heldout: torch.Tensor
    tokenizer: Any
    vocab_size: int
    source: str
    heldout_rule: str
    tokenizer_name: str


def _texts(settings: DepthFamilySettings) -> tuple[str, str, str, str]:
    """(train text, held-out text, source, held-out rule)."""
    if settings.corpus is None:
        text = corpus(None)
        return text.train, text.heldout, text.source, f"every {HELDOUT_EVERY}th pydoc topic (sorted)"
    from engine.data.dataset_texts import load_texts

    loaded = load_texts(settings.corpus, "train", settings.text_column)
    texts = [t for t in loaded.texts if t.strip()]
    if len(texts) < 2:
        raise UserError(f"--corpus {settings.corpus} holds {len(texts)} text; it needs at least two (every "
                        f"{CORPUS_HELDOUT_EVERY}th is held out)")
    heldout = texts[::CORPUS_HELDOUT_EVERY]
    train = [t for i, t in enumerate(texts) if i % CORPUS_HELDOUT_EVERY]
    return "\n\n".join(train), "\n\n".join(heldout), loaded.spec.label(), f"every {CORPUS_HELDOUT_EVERY}th text"


def family_text(settings: DepthFamilySettings) -> FamilyText:
    """The corpus read and tokenized, its sizes checked against the held-out split and the budgets."""
    train_text, heldout_text, source, rule = _texts(settings)
    if settings.base_model is None:
        chars = CharTokenizer.from_text(train_text + heldout_text)
        train = torch.tensor(chars.encode(train_text), dtype=torch.long)
        heldout = torch.tensor(chars.encode(heldout_text), dtype=torch.long)
        tokenizer, vocab, name = chars.transformers(), chars.vocab_size, "characters of the corpus"
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(settings.base_model)
        train = torch.tensor(token_ids(tokenizer, train_text, None, add_special_tokens=False).tolist())
        heldout = torch.tensor(token_ids(tokenizer, heldout_text, None, add_special_tokens=False).tolist())
        vocab, name = len(tokenizer), f"{settings.base_model}'s tokenizer"
    need = settings.eval_windows * (settings.context + 1)
    if len(heldout) < need:
        raise UserError(f"the held-out text of {_short(source)} has {len(heldout)} tokens, fewer than the "
                        f"{need} that --eval-windows {settings.eval_windows} x (--context {settings.context} + 1) "
                        "need; give a larger --corpus or lower --eval-windows or --context")
    if len(train) < max(settings.tokens):
        raise UserError(f"the training text of {_short(source)} has {len(train)} tokens, fewer than the largest "
                        f"--tokens {max(settings.tokens)} (a member sees its text at most once); give a larger "
                        "--corpus or smaller --tokens")
    windows = val_batches(heldout, 1, settings.eval_windows, settings.context)[0]
    return FamilyText(train, windows, tokenizer, vocab, source, rule, name)


def _short(source: str) -> str:
    return Path(source).name if len(source) > 80 else source
