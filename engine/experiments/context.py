"""What a front end hands an experiment besides its settings: the model, the cancel flag, where to
keep checkpoints, and the session's earlier results it reads, decoded through their classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from engine.core.errors import UserError
from engine.core.events import CancelToken, ResultDocument, decode_or_none
from engine.core.turns import ModelTurns
from engine.disk.session_layout import CHECKPOINTS

if TYPE_CHECKING:
    from engine.models.loading import LoadedModel

R = TypeVar("R", bound=ResultDocument)


@dataclass
class RunContext:
    """`checkpoint_dir` is the experiment's own folder in the session (checkpoints, saved layers);
    `output_dir` the session folder, for files a run leaves for later (growth's final models);
    `resume` asks it to continue from what is there; `inputs` holds earlier results of the session
    the experiment reads (the ablation map, say), by result name, as JSON (so workers can be sent
    them); an experiment reads them typed with `input`. `share` is this worker's units of a split
    sweep (engine/models/distributed.py), where the experiment reads them from the context rather
    than its settings (manipulate's trials, toy-depth's students); None: all of them. `turns`: the
    model's turns where the console shares it with its prompt pane (engine/core/turns.py): an
    experiment run in the console changes the model only inside a turn; None: not shared.
    `folders_read`: the experiments whose checkpoint folders it may read (its registry row's
    `reads_folders`, set as the row runs it), through `folder_of`."""

    model: LoadedModel | None = None
    cancel: CancelToken = field(default_factory=CancelToken)
    checkpoint_dir: Path | None = None
    output_dir: Path | None = None
    resume: bool = False
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    share: list[Any] | None = None
    turns: ModelTurns | None = None
    folders_read: tuple[str, ...] = ()

    def needed_model(self, experiment: str) -> LoadedModel:
        """The model of an experiment whose registry row needs one; one line where none was loaded."""
        if self.model is None:
            raise UserError(f"{experiment} needs a model")
        return self.model

    def folder_of(self, experiment: str, *parts: str) -> Path | None:
        """`experiment`'s checkpoint folder in the session (and `parts` below it); None where there is
        no session or a part of the way is a symbolic link (a session folder is untrusted: nothing is
        read from outside it). An experiment its row does not say it reads is a programming error."""
        if experiment not in self.folders_read:
            raise ValueError(f"reads {experiment}'s folder, which its registry row's reads_folders does not name")
        if self.output_dir is None:
            return None
        path = Path(self.output_dir)
        for part in (CHECKPOINTS, experiment, *parts):
            path = path / part
            if path.is_symlink():
                return None
        return path

    def input(self, cls: type[R]) -> R | None:
        """The session's result of this class (results/<cls.name>.json); None when the session has
        none, one that does not read as this class (a damaged or foreign file), or only the partial
        result of a stopped run (a map of 12 of 30 layers would rank the 12 alone)."""
        result = decode_or_none(cls, self.inputs.get(cls.name))
        return None if getattr(result, "partial", None) is True else result
