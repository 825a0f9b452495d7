"""Evaluation and calibration text from datasets, scored by a named protocol.

A SPEC is a Hugging Face dataset `NAME[:CONFIG][:SPLIT]` (`wikitext:wikitext-2-raw-v1:test`,
`allenai/c4:en:validation`), loaded with `datasets` (streamed when --max-windows or --max-tokens
bound what is read), or a local file or folder: a text file (its lines are its texts), JSON lines,
JSON, parquet, or a folder of them (read by `datasets`, its split picked from the file names).

The papers' protocol (GPTQ, SparseGPT, SLEB, ShortGPT, Gromov et al.): the texts joined with blank
lines, `"\\n\\n".join(texts)`, tokenized once with the tokenizer's defaults, cut into
non-overlapping windows of `context` tokens with the remainder dropped, each window scored on its
tokens after the first; perplexity = exp(mean token NLL). The sliding window (`stride` < context, as
in Hugging Face's perplexity guide): windows start every `stride` tokens and each scores only the
tokens the previous one did not (the first scores all after its first token). Calibration samples
(the usual 128 x 2048 of Wanda, SparseGPT, SLEB): random windows of the train split's token stream,
from a seeded generator.

What is read is bounded: with --max-tokens or --max-windows only the beginning of a source that
they need (a file read a chunk at a time, parquet and hub datasets streamed, the text tokenized in
growing beginnings: `engine.data.text.token_ids`); without them at most `engine.data.text.TEXT_BUDGET` (64 MB),
a local source over it refused before it is read.

No torch or `datasets` at import: the console's views import `comparable`.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import UserError
from engine.core.files import BUDGET_TEXT, TEXT_BUDGET, path_kind
from engine.data.text import SLACK, clip_texts, token_ids

if TYPE_CHECKING:
    import torch

INSTALL = "pip install 'anatomy-tui[eval]'"
LOCAL_SUFFIXES = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
PAPERS, SLIDING, TEXTS = "papers", "sliding", "texts"
# What two results must share for their perplexities to be comparable (EvalProtocol's fields).
COMPARED = ("dataset", "config", "split", "revision", "text_column", "protocol", "context", "stride", "tokens")
READ_CHUNK = 2**20  # characters read from a local file at a time


@dataclass(frozen=True)
class DatasetSpec:
    """A parsed SPEC: a hub dataset (name, config, split) or a local path (split: of a folder)."""

    name: str
    config: str | None
    split: str | None
    local: bool

    @classmethod
    def parse(cls, spec: str) -> DatasetSpec:
        text = spec.strip()
        if not text:
            raise UserError("--eval-dataset/--calib-dataset: give NAME[:CONFIG][:SPLIT] or a local file or folder")
        try:
            path = Path(text).expanduser()
        except RuntimeError:  # ~someone who is no user here
            path = Path(text)
        kind = path_kind(path, "dataset")
        if kind == "other":
            raise UserError(f"dataset {text}: not a regular file or folder (a device or a pipe); give a .txt, .jsonl, "
                            ".json or .parquet file or a folder of them")
        if kind != "missing":
            return cls(str(path), None, None, True)
        parts = text.split(":")
        if len(parts) > 3 or not all(parts) or text.startswith((".", "/", "~")):
            raise UserError(f"dataset {spec!r}: no such file or folder, and not a Hugging Face dataset "
                            "NAME[:CONFIG][:SPLIT] (e.g. wikitext:wikitext-2-raw-v1:test)")
        name, *rest = parts
        config, split = (rest + [None, None])[:2]
        return cls(name, config, split, False)

    def label(self) -> str:
        return ":".join(p for p in (self.name, self.config, self.split) if p)


@dataclass(frozen=True)
class LoadedTexts:
    """A dataset's texts in their order, and where they came from."""

    texts: tuple[str, ...]
    spec: DatasetSpec
    split: str | None  # the split read (None: a single local file)
    revision: str | None
    complete: bool = True  # the whole source was read (False: reading stopped at `stream_chars`)


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError(f"reading a dataset needs the `datasets` package: {INSTALL}") from None
    return datasets


def _column(rows: Sequence[Mapping[str, Any]] | Any, column: str, where: str, chars: int | None = None
            ) -> tuple[list[str], bool]:
    """(texts of `column`, whether every row was read): rows are read until the texts joined with
    blank lines reach `chars` characters (None: all of them, up to TEXT_BUDGET, past which it is
    one line naming the bounds)."""
    names = getattr(rows, "column_names", None)
    if names is not None and column not in names:
        raise UserError(f"{where} has no column {column!r} (it has {', '.join(names)}); use --text-column")
    texts: list[str] = []
    size = 0
    for row in rows:
        if chars is not None and size >= chars:
            return texts, False
        if column not in row:
            raise UserError(f"{where}: a row has no {column!r} field; use --text-column")
        value = row[column]
        if not isinstance(value, str):
            raise UserError(f"{where}: column {column!r} holds {type(value).__name__}, not text; use --text-column")
        texts.append(value)
        size += len(value) + 2
        if chars is None and size > TEXT_BUDGET:
            raise over_budget(where, size, past=True)
    return texts, True


def over_budget(where: str, size: int, past: bool = False) -> UserError:
    """The one line for text over TEXT_BUDGET read without a bound."""
    amount = f"holds more than {BUDGET_TEXT}" if past else f"is {size / 2**20:.0f} MB"
    return UserError(f"{where} {amount} of text, over the {BUDGET_TEXT} a run reads without a bound: give a "
                     "smaller file, or with --eval-dataset --max-tokens N or --max-windows N (only its beginning "
                     "is read)")


def _disk_size(path: Path) -> int:
    """Bytes of a file, or of every file in a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _text_lines(path: Path, chars: int | None) -> tuple[list[str], bool]:
    """(lines of a UTF-8 text file, read to its end?), read READ_CHUNK characters at a time and
    stopped once `chars` characters are read (a one-line file of 200 MB is never held whole): the
    lines joined with blank lines are then the beginning of the whole file's."""
    parts: list[str] = []
    size = 0
    with path.open(encoding="utf-8", newline="") as handle:
        while chars is None or size < chars:
            chunk = handle.read(READ_CHUNK if chars is None else min(READ_CHUNK, chars - size))
            if not chunk:
                return "".join(parts).splitlines(), True
            parts.append(chunk)
            size += len(chunk)
        text = "".join(parts)
        if text.endswith("\r"):  # perhaps half of a \r\n: the rest is unread
            text = text[:-1]
        return text.splitlines(), False


def _json_lines(path: Path, column: str, chars: int | None) -> tuple[list[str], bool]:
    """(texts of a JSON-lines file's `column`, read to its end?), a line at a time (none longer than
    TEXT_BUDGET), until `chars` characters of text."""
    texts: list[str] = []
    size = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(iter(lambda: handle.readline(TEXT_BUDGET + 1), ""), 1):
            if len(line) > TEXT_BUDGET:
                raise UserError(f"dataset file {path}: line {number} is longer than {BUDGET_TEXT}")
            if not line.strip():
                continue
            if chars is not None and size >= chars:
                return texts, False
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"dataset file {path}: line {number} of a JSON-lines file is not JSON") from None
            found, _ = _column([row], column, str(path))
            texts.extend(found)
            size += len(found[0]) + 2
    return texts, True


def _revision(dataset: Any) -> str | None:
    """The hub commit a dataset was read at, where `datasets` says (its files' URLs or cache
    path carry it), else its declared version; None when nothing says."""
    info = getattr(dataset, "info", None)
    places = list((getattr(info, "download_checksums", None) or {}).keys())
    places += [f.get("filename", "") for f in getattr(dataset, "cache_files", None) or []]
    for place in places:
        found = re.search(r"[@/]([0-9a-f]{40})(?:/|$)", str(place))
        if found:
            return found.group(1)
    version = str(getattr(info, "version", "") or "")
    return version if version and version != "0.0.0" else None


def _local(spec: DatasetSpec, split: str, column: str, chars: int | None
           ) -> tuple[list[str], str | None, str | None, bool]:
    """(texts, split read, revision, read to the end?) of a local file or folder. A text file is
    read here (its lines; no `datasets` needed), JSON lines too; parquet and folders go through
    `datasets`, streamed when `chars` bounds what is read. Without a bound, a source over
    TEXT_BUDGET on disk is refused before it is read."""
    path = Path(spec.name)
    is_file = path_kind(path, "dataset") == "file"
    kind = LOCAL_SUFFIXES.get(path.suffix.lower()) if is_file else None
    if is_file and kind is None:
        raise UserError(f"dataset file {path}: unknown kind; use .txt, .jsonl, .json or .parquet")
    if chars is None:
        try:
            size = _disk_size(path)
        except OSError as exc:
            raise UserError(f"dataset {path}: {exc.strerror or _first_line(exc)}") from None
        if size > TEXT_BUDGET:
            raise over_budget(f"dataset {path}", size)
    try:
        if kind == "text":
            return _text_file(path, chars)
        if kind == "json" and path.suffix.lower() == ".jsonl":
            texts, complete = _json_lines(path, column, chars)
            return texts, None, None, complete
    except UnicodeDecodeError:
        raise UserError(f"dataset file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"dataset file {path}: {exc.strerror or _first_line(exc)}") from None
    if kind == "parquet":
        _check_rows(path)
    datasets = _datasets()
    datasets.disable_progress_bars()  # a local file takes a moment: no bars on the terminal
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its error log of a bad file: the one line below says it
    try:
        if kind is not None:
            loaded = datasets.load_dataset(kind, data_files=str(path), split="train", streaming=chars is not None)
            texts, complete = _column(loaded, column, str(path), chars)
            return texts, None, None, complete
        splits = datasets.load_dataset(str(path), streaming=chars is not None)
        chosen = split if split in splits else next(iter(splits)) if len(splits) == 1 else None
        if chosen is None:
            raise UserError(f"dataset folder {path} has splits {', '.join(splits)} but no {split!r}; "
                            f"name the files after the split ({split}-00000.parquet)")
        texts, complete = _column(splits[chosen], column, f"{path} ({chosen})", chars)
        return texts, chosen, None, complete
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - `datasets` and pyarrow raise many kinds (DatasetGenerationError, ArrowInvalid)
        reason: BaseException = exc
        while reason.__cause__ is not None:  # DatasetGenerationError: the reason is its cause's
            reason = reason.__cause__
        raise UserError(f"dataset {path} could not be read ({_first_line(reason)}); give a .txt, .jsonl, .json or "
                        ".parquet file of text rows") from None
    finally:
        datasets.logging.set_verbosity(verbosity)


def _check_rows(path: Path) -> None:
    """A parquet file with no rows is one line saying so (`datasets` fails on it deep inside)."""
    try:
        import pyarrow.parquet as pq

        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception:  # noqa: BLE001 - not readable as parquet: `datasets` says why, below
        return
    if rows == 0:
        raise UserError(f"dataset {path} holds no rows (an empty parquet file); give a file of text rows")


def _text_file(path: Path, chars: int | None) -> tuple[list[str], str | None, str | None, bool]:
    texts, complete = _text_lines(path, chars)
    return texts, None, None, complete


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _hub(spec: DatasetSpec, split: str, column: str, stream_chars: int | None
         ) -> tuple[list[str], str | None, bool]:
    """(texts, revision, read to the end?) of a hub dataset's split; with `stream_chars`, streamed
    and read only until that many characters (enough for the tokens asked for)."""
    datasets = _datasets()
    try:
        loaded = datasets.load_dataset(spec.name, spec.config, split=split, streaming=stream_chars is not None)
        texts, complete = _column(loaded, column, spec.label() or spec.name, stream_chars)
        return texts, _revision(loaded), complete
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - `datasets` raises many kinds (offline, missing config, no split)
        raise UserError(f"could not load dataset {spec.label()!r} (split {split}): {_first_line(exc)}; "
                        "a hub dataset needs the network, or give a local file or folder") from None


@functools.lru_cache(maxsize=4)
def load_texts(spec_text: str, default_split: str, column: str = "text", stream_chars: int | None = None
               ) -> LoadedTexts:
    """The texts a SPEC names, in order (cached: the memory plan and the run read the same ones);
    with `stream_chars`, only the first texts, until about that many characters (`complete` says
    whether that was all); without it, at most TEXT_BUDGET."""
    spec = DatasetSpec.parse(spec_text)
    split = spec.split or default_split
    if spec.local:
        texts, read, revision, complete = _local(spec, split, column, stream_chars)
    else:
        texts, revision, complete = _hub(spec, split, column, stream_chars)
        read = split
    if not any(t.strip() for t in texts):
        raise UserError(f"dataset {spec.label()} holds no text (column {column!r})")
    return LoadedTexts(tuple(texts), spec, read, revision, complete)


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
