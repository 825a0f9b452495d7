"""Evaluation and calibration text from datasets, scored by a named protocol.

The texts come from a SPEC (engine/data/dataset_texts.py: a hub dataset or a local file or folder).

The papers' protocol (GPTQ, SparseGPT, SLEB, ShortGPT, Gromov et al.): the texts joined with blank
lines, `"\\n\\n".join(texts)`, tokenized once with the tokenizer's defaults, cut into
non-overlapping windows of `context` tokens with the remainder dropped, each window scored on its
tokens after the first; perplexity = exp(mean token NLL). The sliding window (`stride` < context, as
in Hugging Face's perplexity guide): windows start every `stride` tokens and each scores only the
tokens the previous one did not (the first scores all after its first token). Calibration samples
(the usual 128 x 2048 of Wanda, SparseGPT, SLEB): random windows of the train split's token stream,
from a seeded generator.

With --max-tokens or --max-windows only the beginning of a source is read (`stream_chars`), and the
text is tokenized in growing beginnings (`engine.data.text.token_ids`) until it holds the tokens
asked for; without them at most `engine.core.files.TEXT_BUDGET` (64 MB).

No torch or `datasets` at import: the console's views import `comparable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.files import BUDGET_TEXT, TEXT_BUDGET
from engine.data.dataset_texts import load_texts
from engine.data.text import SLACK, clip_texts, token_ids

if TYPE_CHECKING:
    import torch

PAPERS, SLIDING, TEXTS = "papers", "sliding", "texts"
# What two results must share for their perplexities to be comparable (EvalProtocol's fields).
COMPARED = ("dataset", "config", "split", "revision", "text_column", "protocol", "context", "stride", "tokens")


@dataclass(frozen=True)
class Windows:
    """Token windows to score: each row's ids, and how many of its last targets count."""

    rows: tuple[tuple[int, ...], ...]
    scored: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(self.scored)


def cut_windows(ids: Sequence[int], context: int, stride: int | None = None, max_windows: int | None = None
                ) -> Windows:
    """The papers' windows (stride None: non-overlapping, remainder dropped, all but the first token
    scored) or sliding ones (every `stride` tokens, each scoring only its new tokens)."""
    rows, scored = [], []
    if stride is None:
        for start in range(0, len(ids) - context + 1, context):
            rows.append(tuple(ids[start : start + context]))
            scored.append(context - 1)
    else:
        previous_end = 0
        for start in range(0, len(ids), stride):
            end = min(start + context, len(ids))
            if end - start < 2:
                break
            rows.append(tuple(ids[start:end]))
            scored.append(min(end - previous_end, end - start - 1))
            previous_end = end
            if end == len(ids):
                break
    if max_windows is not None:
        rows, scored = rows[:max_windows], scored[:max_windows]
    return Windows(tuple(rows), tuple(scored))


@dataclass(frozen=True)
class EvalSource:
    """What a run evaluates on: plain texts (the built-in sets, --eval-file; `name` says which) or
    a dataset's windows with the protocol its result records."""

    texts: tuple[str, ...] | None
    windows: Windows | None
    name: str
    protocol: EvalProtocol | None = None  # the windows' (texts: made by the evaluator, which counts the tokens)

    def protocol_with(self, max_length: int, tokens: int) -> EvalProtocol:
        """The recorded protocol: the windows', or for texts each scored alone up to `max_length`."""
        if self.protocol is not None:
            return self.protocol
        return EvalProtocol(dataset=self.name, config=None, split=None, revision=None, text_column=None,
                            protocol=TEXTS, context=max_length, stride=None, windows=len(self.texts or ()),
                            tokens=tokens)


def wanted_tokens(settings: Any) -> int | None:
    """How many tokens of the stream --max-tokens and --max-windows need at most (None: all)."""
    wanted = [settings.max_tokens] if settings.max_tokens is not None else []
    if settings.max_windows is not None:
        step = settings.stride or settings.context
        wanted.append((settings.max_windows - 1) * step + settings.context)
    return min(wanted) if wanted else None


def stream_chars(settings: Any) -> int | None:
    """With --max-tokens or --max-windows, how many characters of a dataset to read first (enough
    for the tokens: a token is rarely over 16 characters; more is read when they are not); None:
    the whole source (at most TEXT_BUDGET)."""
    wanted = wanted_tokens(settings)
    return None if wanted is None else min(16 * wanted + 4096, TEXT_BUDGET)


def eval_source(tokenizer: Any, settings: Any) -> EvalSource:
    """An evaluation-text group's source: --eval-dataset's windows, --eval-file's lines, or a
    built-in set."""
    if settings.eval_dataset is not None:
        return dataset_windows(tokenizer, settings)
    from engine.data.text import eval_texts

    path = Path(settings.eval_file) if settings.eval_file else None
    return EvalSource(clip_texts(tokenizer, eval_texts(path, settings.eval_set), settings.max_length), None,
                      str(path) if path else f"builtin:{settings.eval_set}")


def dataset_windows(tokenizer: Any, settings: Any) -> EvalSource:
    """--eval-dataset read, joined with blank lines, tokenized as one stream (the tokenizer's
    defaults) and cut by the settings' protocol. With --max-tokens or --max-windows only the
    beginning of the source is read and tokenized, more of it while it holds too few tokens."""
    wanted, chars = wanted_tokens(settings), stream_chars(settings)
    while True:
        loaded = load_texts(settings.eval_dataset, "test", settings.text_column, chars)
        # a beginning of the source: its last tokens may change with the text after it, so it is
        # enough when it holds SLACK more than wanted (or is the whole source)
        ids = token_ids(tokenizer, "\n\n".join(loaded.texts), None if wanted is None else wanted + SLACK)
        if wanted is None or len(ids) >= wanted + SLACK or loaded.complete:
            ids = ids if wanted is None else ids[:wanted]
            break
        assert chars is not None  # None only when nothing is wanted, and then the loop has ended
        if chars >= TEXT_BUDGET:
            raise UserError(f"dataset {loaded.spec.label()}: its first {BUDGET_TEXT} of text hold {len(ids)} "
                            f"tokens, fewer than the {wanted} --max-tokens/--max-windows ask for (a run reads at "
                            f"most {BUDGET_TEXT}); lower them")
        chars = min(4 * chars, TEXT_BUDGET)
    windows = cut_windows(ids, settings.context, settings.stride, settings.max_windows)
    if not windows.rows:
        raise UserError(f"dataset {loaded.spec.label()} has {len(ids)} tokens, fewer than one window of "
                        f"--context {settings.context}; lower --context or raise --max-tokens")
    protocol = EvalProtocol(
        dataset=loaded.spec.name, config=loaded.spec.config, split=loaded.split, revision=loaded.revision,
        text_column=settings.text_column, protocol=SLIDING if settings.stride else PAPERS,
        context=settings.context, stride=settings.stride, windows=len(windows.rows), tokens=windows.tokens,
    )
    return EvalSource(None, windows, loaded.spec.label(), protocol)


def calibration_blocks(tokenizer: Any, spec: str, column: str, block_size: int, n_blocks: int, seed: int
                       ) -> tuple[torch.Tensor, str]:
    """`n_blocks` random windows of `block_size` tokens from the split's token stream (the texts
    joined with blank lines, tokenized once), their starts drawn by a seeded generator: a LongTensor
    [n_blocks, block_size], and a description of the source."""
    import numpy as np
    import torch

    loaded = load_texts(spec, "train", column)
    ids = token_ids(tokenizer, "\n\n".join(loaded.texts), add_special_tokens=False)
    if len(ids) < block_size:
        raise UserError(f"calibration dataset {loaded.spec.label()} has {len(ids)} tokens, fewer than one "
                        f"--block-size {block_size}")
    starts = np.random.default_rng(seed).integers(0, len(ids) - block_size + 1, size=n_blocks)
    blocks = torch.tensor(np.stack([ids[s : s + block_size] for s in starts]), dtype=torch.long)
    source = f"{loaded.spec.label() or loaded.spec.name} ({loaded.split or 'file'}), {n_blocks} random windows"
    return blocks, source


def comparable(a: EvalProtocol | Mapping[str, Any] | None, b: EvalProtocol | Mapping[str, Any] | None
               ) -> str | None:
    """None when two results' perplexities were measured the same way; else one line saying what
    differs (a result without a recorded protocol is never comparable)."""
    if a is None or b is None:
        return "perplexities not comparable: a result records no evaluation protocol"
    da = a if isinstance(a, Mapping) else _as_dict(a)
    db = b if isinstance(b, Mapping) else _as_dict(b)
    diffs = [f"{key} {da.get(key)!r} vs {db.get(key)!r}" for key in COMPARED if da.get(key) != db.get(key)]
    return "perplexities not comparable: " + "; ".join(diffs) if diffs else None


def _as_dict(protocol: EvalProtocol) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(protocol)


def describe(protocol: EvalProtocol | Mapping[str, Any]) -> str:
    """The protocol in one printable line."""
    p = protocol if isinstance(protocol, Mapping) else _as_dict(protocol)
    where = ":".join(str(p[k]) for k in ("dataset", "config", "split") if p.get(k))
    revision = f" @{str(p['revision'])[:12]}" if p.get("revision") else ""
    if p.get("protocol") == TEXTS:
        how, count = f"each text alone, up to {p.get('context')} tokens", f"{p.get('windows')} texts"
    elif p.get("protocol") == SLIDING:
        how = f"sliding windows of {p.get('context')} tokens, stride {p.get('stride')}"
        count = f"{p.get('windows')} windows"
    else:
        how = f"the papers' protocol: non-overlapping windows of {p.get('context')} tokens"
        count = f"{p.get('windows')} windows"
    return f"evaluation: {where}{revision}; {how}; {count}, {p.get('tokens')} scored tokens"


def is_eval_protocol(doc: Any) -> bool:
    """Whether a result's `protocol` is a perplexity protocol (EvalProtocol's fields), which
    `describe` prints; evaluate's lm-eval protocol is its view's to print."""
    return isinstance(doc, Mapping) and {"dataset", "protocol", "context", "windows", "tokens"} <= set(doc)


@dataclass(frozen=True)
class EvalProtocol:
    """How a result's perplexity was measured (engine/data/eval_data.py): two runs' perplexities are
    comparable only when these match (`engine.data.eval_data.comparable`). `protocol` is `papers`
    (non-overlapping windows of `context` tokens, remainder dropped), `sliding` (windows every
    `stride` tokens, each scoring its new tokens) or `texts` (the built-in sets and --eval-file:
    each text alone, truncated at `context` = --max-length); `windows` counts windows or texts,
    `tokens` the scored tokens."""

    dataset: str  # a hub dataset's name, a local path, or builtin:full / builtin:paper / the --eval-file
    config: str | None
    split: str | None
    revision: str | None  # the hub commit where `datasets` says, else its version; None when unknown
    text_column: str | None
    protocol: str
    context: int
    stride: int | None
    windows: int
    tokens: int
