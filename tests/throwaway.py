"""A throwaway experiment written as files into a temporary package, the way a contributor adds
one: its folder (`letter_count/vocabulary.py`, `letter_count/run.py`), its view
(`views/letter_count.py`, found through tui.views' search path) and one registry row. Nothing else
in the project changes; `unregister` takes the row and its kinds out again."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from engine import registry
from engine.registry import Experiment

VOCABULARY = '''"""The letter-count experiment's vocabulary: settings, its event, its result, a sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from engine.core.events import Event, ResultDocument, event_type, result_type
from engine.core.settings import Settings, setting
from engine.models.memory import ModelShape, Training


@dataclass(frozen=True)
class LetterCountSettings(Settings):
    words: tuple[str, ...] = setting(("alpha", "beta", "gamma", "delta", "epsilon"), "the words counted")
    repeat: int = setting(1, "times each word is counted", low=1)
    block_size: int = setting(8, "tokens per training block (for the memory plan)", low=1)

    def training_needs(self, shape: ModelShape) -> Training:
        return Training(shape.layer_matrices, 2, self.block_size, 1)


@event_type
@dataclass(frozen=True)
class WordCounted(Event):
    """One word counted."""

    kind: ClassVar[str] = "letter-count.word"
    word: str
    letters: int


@result_type
@dataclass(frozen=True)
class LetterCounts(ResultDocument):
    """results/letter-count.json."""

    name: ClassVar[str] = "letter-count"
    counts: dict[str, int]
    total: int


def sample() -> LetterCounts:
    return LetterCounts(counts={"ab": 2, "cde": 3}, total=5)
'''

RUN = '''"""The letter-count experiment's computation: count, and split the words over workers."""

from __future__ import annotations

from dataclasses import replace

from engine.core.events import Progress, Result, json_safe
from engine.models.distributed import ShardPlan
from letter_count.vocabulary import LetterCounts, WordCounted


def run(settings, context):
    counts = {}
    words = context.share if context.share is not None else settings.words
    for done, word in enumerate(words, 1):
        context.cancel.check()
        counts[word] = len(word) * settings.repeat
        yield WordCounted(word=word, letters=counts[word])
        yield Progress(done=done, total=len(words), label=word)
    yield Result(name="letter-count", data=json_safe(LetterCounts(counts=counts, total=sum(counts.values()))))


def merge(docs, settings):
    """The words in the order the settings give them, as a serial run counts them."""
    counts = {word: count for doc in docs for word, count in doc["counts"].items()}
    ordered = {word: counts[word] for word in settings.words}
    return {"counts": ordered, "total": sum(ordered.values())}


def shard_plan(settings, n_layers, inputs, model_name):
    return ShardPlan(list(settings.words), lambda share: replace(settings, words=tuple(share)),
                     lambda docs: merge(docs, settings), notes=(f"{len(settings.words)} words",))
'''

VIEW = '''"""The letter-count view: how `run` prints it and its entry in the Analyses pane."""

from rich.console import Console
from rich.table import Table
from rich.text import Text

from letter_count.vocabulary import LetterCounts
from tui.views import Analysis

ANALYSIS = Analysis("Letters counted", place=0)


def print_result(doc):
    table = Table(title="letters per word")
    table.add_column("word")
    table.add_column("letters", justify="right")
    for word, count in LetterCounts.from_json(doc).counts.items():
        table.add_row(word, str(count))
    Console().print(table)


def summary(result, command):
    return Text(f"{result.total} letters in {len(result.counts)} words")
'''


def write_experiment(root: Path, with_view: bool = True) -> None:
    """The experiment's folder under `root` (put on sys.path) and, with `with_view`, its view."""
    folder = root / "letter_count"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text('"""Counts letters: a throwaway experiment."""\n')
    (folder / "vocabulary.py").write_text(VOCABULARY)
    (folder / "run.py").write_text(RUN)
    if with_view:
        (root / "views").mkdir()
        (root / "views" / "letter_count.py").write_text(VIEW)


def register(root: Path) -> Experiment:
    """The row, as it would stand in engine/registry.py's list."""
    row = Experiment("letter-count", "count the letters of a few words", "letter_count.vocabulary",
                     "LetterCountSettings", "LetterCounts", "letter_count.run", needs_model=False,
                     shardable=True)  # fmt: skip
    registry.register(row)
    return row


def installed(root: Path, with_view: bool = True) -> Iterator[Experiment]:
    """Writes, imports and registers the experiment; afterwards takes all of it out again."""
    import tui.views

    write_experiment(root, with_view)
    sys.path.insert(0, str(root))
    search = list(tui.views.__path__)
    if with_view:
        tui.views.__path__.append(str(root / "views"))
    try:
        yield register(root)
    finally:
        registry.unregister("letter-count")
        tui.views.__path__[:] = search
        sys.path.remove(str(root))
        for name in [name for name in sys.modules if name.startswith(("letter_count", "tui.views.letter_count"))]:
            del sys.modules[name]
