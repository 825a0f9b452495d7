"""Text that needs no download: the project's own evaluation sentences and a training corpus made
from the English documentation CPython ships (`pydoc_data.topics`), split deterministically."""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from engine.errors import UserError

# Ten sentences of different kinds (narrative, science, news, dialogue, instructions, lists,
# history, health, code, nature), like the paper's ten diverse English sentences.
PAPER_SUBSET = (0, 4, 8, 12, 16, 20, 24, 28, 32, 36)
EVAL_SETS = ("full", "paper")
HELDOUT_EVERY = 5  # every fifth pydoc topic (in sorted order) is held out
# The most text a run reads from an evaluation or calibration source without a bound (--max-tokens,
# --max-windows of --eval-dataset): 64 MiB of characters, a few times WikiText-103's test split. A file
# over it is refused before it is read, a dataset read through `datasets` once it holds more; with a
# bound, reading stops where the bound is met (engine/eval_data.py).
TEXT_BUDGET = 64 * 2**20
BUDGET_TEXT = f"{TEXT_BUDGET // 2**20} MB"


def builtin_eval_sentences() -> list[str]:
    text = resources.files("engine").joinpath("data/eval_sentences.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_lines(path: Path, what: str) -> list[str]:
    """Non-empty lines of a UTF-8 file, with one-line errors for the usual mistakes: no such file,
    a folder, a name too long, no permission, over TEXT_BUDGET (refused before it is read), not
    UTF-8, binary."""
    path = Path(path)
    kind = path_kind(path, what)
    if kind == "folder":
        raise UserError(f"{what} {short_path(path)} is a folder; give a UTF-8 text file, one text per line")
    if kind == "other":
        raise UserError(f"{what} {short_path(path)} is not a regular file (a device or a pipe); give a UTF-8 text "
                        "file, one text per line")
    if kind != "file":
        raise UserError(f"{what} {short_path(path)} does not exist; give a UTF-8 text file, one text per line")
    try:
        size = path.stat().st_size
        if size > TEXT_BUDGET:
            beginning = ", or score its beginning: --eval-dataset FILE --max-tokens N" if "evaluation" in what else ""
            raise UserError(f"{what} {short_path(path)} is {size / 2**20:.0f} MB, over the {BUDGET_TEXT} a run reads "
                            f"whole; give a smaller file{beginning}")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not UTF-8 text; convert it to UTF-8") from exc
    except OSError as exc:
        raise UserError(f"{what} {short_path(path)}: {exc.strerror or exc}") from None
    if "\0" in text:  # valid UTF-8 but binary (NUL bytes): scoring it would measure nothing meant
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UserError(f"{what} {path} is binary (a NUL byte on line {line}); give a UTF-8 text file")
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise UserError(f"{what} {path} is empty; put one text per line")
    return lines


# OSErrors of a path a user gave (a name too long, no permission, a folder for a file, a loop of links):
# the user's to fix, one line naming the path (tui/cli.py), never "the memory plan skipped"
PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.ELOOP,
                         errno.ENOENT, errno.EROFS})


def path_kind(path: Path, what: str) -> str:
    """'file', 'folder', 'other' (a device, a pipe) or 'missing' for a path a user gave; an OSError
    (a name too long, a folder that cannot be searched) is one line naming `what`."""
    try:
        return ("file" if path.is_file() else "folder" if path.is_dir() else "other" if path.exists()
                else "missing")
    except OSError as exc:
        raise UserError(f"{what} {short_path(path)}: {exc.strerror or str(exc)}") from None


def short_path(path: Path | str) -> str:
    """A path as an error shows it: at most 80 characters."""
    text = str(path)
    return text if len(text) <= 80 else f"{text[:40]}...{text[-20:]} ({len(text)} characters)"


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
