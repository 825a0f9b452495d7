"""The texts a dataset SPEC names, read bounded.

A SPEC is a Hugging Face dataset `NAME[:CONFIG][:SPLIT]` (`wikitext:wikitext-2-raw-v1:test`,
`allenai/c4:en:validation`), loaded with `datasets` (streamed when --max-windows or --max-tokens
bound what is read), or a local file or folder: a text file (its lines are its texts), JSON lines,
JSON, parquet, or a folder of them (read by `datasets`, its split picked from the file names).

What is read is bounded: with a bound in characters (engine/data/eval_data.py `stream_chars`, from
--max-tokens or --max-windows) only the beginning of a source (a file read a chunk at a time,
parquet and hub datasets streamed); without one at most `engine.core.files.TEXT_BUDGET` (64 MB), a
local source over it refused before it is read.

No `datasets` at import: it is imported when a source needs it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.files import BUDGET_TEXT, TEXT_BUDGET, path_kind

INSTALL = "pip install 'anatomy-tui[eval]'"
LOCAL_SUFFIXES = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
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
