"""Checks before the load: what a model's config and tokenizer can tell about a run, checked
before its weights load (a minute on a 7B model, for a typo).

The runner reads the config and tokenizer once (`engine.models.memory.preview_model`), makes the memory
plan from them and calls `check_before_load`: the settings against the model's shape (layers in
range, component names its family knows, export folders: each experiment's `check_against`), the
evaluation texts against the tokenizer, and weight edits against a --device-map placement that
leaves layers offloaded. Each failure is one UserError line, as the run itself would raise it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.errors import UserError
from engine.core.settings import Settings
from engine.data.text_settings import EvalTextSettings

if TYPE_CHECKING:
    from engine.models.memory import MemoryPlan, ModelPreview


def check_before_load(experiment: str, settings: Settings, preview: ModelPreview, plan: MemoryPlan | None) -> None:
    """One-line UserError for the first thing that would fail once the model has loaded."""
    settings.check_against(preview.shape)
    if isinstance(settings, EvalTextSettings):
        check_eval_tokens(settings, preview.tokenizer)
    if plan is not None:
        check_offload(experiment, settings, plan)


def check_eval_tokens(settings: EvalTextSettings, tokenizer: object) -> None:
    """The evaluation texts leave a token to predict (perplexity needs two tokens in some text),
    as the evaluator will tokenize them. Dataset windows (--eval-dataset) are cut by their own reader."""
    if settings.eval_dataset is not None:
        return
    from engine.data.text import NO_TOKENS
    from engine.models.memory import text_lengths

    texts = settings.eval_source(tokenizer)  # each text cut to what its first --max-length tokens need
    if sum(max(length - 1, 0) for length in text_lengths(tokenizer, texts, settings.max_length)) == 0:
        raise UserError(NO_TOKENS)


def check_offload(experiment: str, settings: Settings, plan: MemoryPlan) -> None:
    """A run that edits weights in place cannot run on layers accelerate keeps offloaded (their
    weights are put back at every forward: `LayerStack.check_editable` refuses them after the
    load); refused now, naming the layers the --max-memory budget leaves there."""
    offloaded = plan.offloaded_layers()
    if not offloaded or not settings.edits_weights():
        return
    from engine.models.loading import placement_text

    raise UserError(f"{experiment} edits weights, but the --device-map placement offloads {len(offloaded)} of "
                    f"{len(plan.layer_devices)} layers ({placement_text(list(plan.layer_devices))}), where an edit "
                    "is lost at the next forward; raise --max-memory until no layer is offloaded, or drop --device-map")
