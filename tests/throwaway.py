"""A throwaway experiment written as files into a temporary package, the way a contributor adds
one: its folder (`letter_count/__init__.py`, `letter_count/vocabulary.py`, `letter_count/run.py`),
its view (`views/letter_count.py`, found through tui.views' search path), its figure
(`figures/letter_count.py`, through figures' search path) and one registry row. Nothing else in the
project changes; `unregister` takes the row and its kinds out again. `without` leaves out a part
(the view, the figure, the frame's declaration), for the contract check to name."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

from engine import registry
from engine.registry import Experiment

VOCABULARY = '''"""The letter-count experiment's vocabulary: settings, its event, its result, a sample."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.events import Event, ResultDocument, event, result
from engine.core.settings import Settings, setting
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.models.memory import ModelShape, Training


@dataclass(frozen=True)
class LetterCountSettings(Settings):
    words: tuple[str, ...] = setting(("alpha", "beta", "gamma", "delta", "epsilon"), "the words counted")
    repeat: int = setting(1, "times each word is counted", low=1)
    block_size: int = setting(8, "tokens per training block (for the memory plan)", low=1)

    def training_needs(self, shape: ModelShape) -> Training:
        return Training(shape.layer_matrices, 2, self.block_size, 1)


@event("letter-count.word")
class WordCounted(Event):
    """One word counted."""

    word: str
    letters: int


@result("letter-count")
class LetterCounts(ResultDocument):
    """results/letter-count.json."""

    counts: dict[str, int]
    total: int
    settings: LetterCountSettings

    def tidy_rows(self):
        return [{"word": word, "letters": count} for word, count in self.counts.items()]


def sample() -> LetterCounts:
    return LetterCounts(counts={"ab": 2, "cde": 3}, total=5, settings=LetterCountSettings(words=("ab", "cde")))


CONTRACT = Contract(LetterCountSettings, LetterCounts, sample,
                    frame=Frame(columns=("word", "letters"), rows=2),
                    figure=FigureShape(panels=(("word", "letters"),)))
'''

PACKAGE = '''"""Counts letters: a throwaway experiment."""


def contract():
    from letter_count.vocabulary import CONTRACT

    return CONTRACT


def computation():
    from letter_count import run

    return run
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
    result = LetterCounts(counts=counts, total=sum(counts.values()), settings=settings)
    yield Result(name="letter-count", data=json_safe(result))


def merge(docs, settings):
    """The words in the order the settings give them, as a serial run counts them."""
    counts = {word: count for doc in docs for word, count in doc["counts"].items()}
    ordered = {word: counts[word] for word in settings.words}
    return {"counts": ordered, "total": sum(ordered.values()), "settings": settings.to_dict()}


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

FIGURE = '''"""The letter-count figure: a bar a word."""

from matplotlib.figure import Figure


def draw(result):
    fig = Figure(figsize=(3.5, 2.5))
    ax = fig.add_subplot()
    ax.bar(list(result.counts), list(result.counts.values()))
    ax.set_xlabel("word")
    ax.set_ylabel("letters")
    return fig
'''


PARTS = ("view", "figure", "frame")  # what `without` may leave out


def write_experiment(root: Path, without: tuple[str, ...] = ()) -> None:
    """The experiment's folder under `root` (put on sys.path) and its view and figure, less the
    parts `without` names (PARTS)."""
    folder = root / "letter_count"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(PACKAGE)
    frame = 'frame=Frame(columns=("word", "letters"), rows=2),'
    (folder / "vocabulary.py").write_text(VOCABULARY.replace(frame, "" if "frame" in without else frame))
    (folder / "run.py").write_text(RUN)
    for part, text in (("view", VIEW), ("figure", FIGURE)):
        if part not in without:
            (root / f"{part}s").mkdir()
            (root / f"{part}s" / "letter_count.py").write_text(text)


def register(root: Path) -> Experiment:
    """The row, as it would stand in engine/registry.py's list (its package imported: the folder)."""
    row = Experiment("letter-count", "count the letters of a few words", importlib.import_module("letter_count"),
                     needs_model=False, shardable=True)
    registry.register(row)
    return row


def installed(root: Path, without: tuple[str, ...] = ()) -> Iterator[Experiment]:
    """Writes, imports and registers the experiment; afterwards takes all of it out again. Its figure
    is found where matplotlib is installed (figures/ needs it)."""
    import tui.views

    write_experiment(root, without)
    sys.path.insert(0, str(root))
    searched = [tui.views]
    try:
        import figures

        searched.append(figures)
    except ImportError:
        pass
    paths = {package: list(package.__path__) for package in searched}
    for package in searched:
        found = root / package.__name__.split(".")[-1]
        if found.is_dir():
            package.__path__.append(str(found))
    try:
        yield register(root)
    finally:
        registry.unregister("letter-count")
        for package, path in paths.items():
            package.__path__[:] = path
        sys.path.remove(str(root))
        for name in [name for name in sys.modules if name.startswith(("letter_count", "tui.views.letter_count",
                                                                      "figures.letter_count"))]:
            del sys.modules[name]
