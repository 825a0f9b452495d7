"""RunContext.needed_model: the one place an experiment's run reads its model, typed, with one line
where none was loaded."""

from typing import Any

import pytest

from engine.core.errors import UserError
from engine.experiments.context import RunContext


def test_a_run_without_a_model_is_one_line_naming_the_experiment() -> None:
    with pytest.raises(UserError, match=r"^weights needs a model$"):
        RunContext().needed_model("weights")


def test_the_loaded_model_is_handed_over_as_it_is() -> None:
    loaded: Any = object()  # a stand-in for a LoadedModel: only its identity is checked
    assert RunContext(model=loaded).needed_model("weights") is loaded
