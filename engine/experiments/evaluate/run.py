"""`evaluate`: zero-shot accuracy through lm-eval-harness on the loaded model and the session's
variants of it, side by side, with the generation check beside each (engine/evaluation/accuracy.py).

Variants (`--variants`, the original first):
- `original`: the loaded model (`--model`).
- `pruned`: its layers `--remove` (0-based), else the session's prune cut (its exported point, else
  its ppl criterion's deepest cut), really dropped (`engine.models.pruning.removed`), then put back.
- `healed`: the folder the session's prune run exported with --heal-steps (the healed cut).
- `recovered`: the layers the session's recovery run fine-tuned, put in for the length of the run.
- `growth`, `uniform`: the session's growth run's saved models (character tokenizers: their
  generation check compares characters).
- `--folder DIR`: an exported Hugging Face folder; `--adapter DIR`: a PEFT adapter on the loaded
  model (cut by `--remove` first when given, for an adapter trained on a cut).
A run keeps the earlier evaluation's rows of the variants it does not evaluate, when the model and
lm-eval's protocol are the same, so the session's evaluate result grows into one comparison.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import Event, Message, Progress, Result
from engine.disk.session_layout import LAYER_WEIGHTS
from engine.evaluation.accuracy import PROMPTS, Harness
from engine.evaluation.judging import continuations, generation_check
from engine.experiments.context import RunContext
from engine.experiments.evaluate.streamed import streamed_run
from engine.experiments.evaluate.vocabulary import (
    EvaluatedModel,
    EvaluateResult,
    EvaluateSettings,
    ModelEvaluated,
)
from engine.experiments.growth.vocabulary import GrowthResult
from engine.experiments.prune.vocabulary import PruneResult
from engine.experiments.session_models import layer_weights, pruned_layers, saved_model_path
from engine.models.streaming import StreamedModel


@dataclass
class Subject:
    """A model to score, with what the row says about it; `tokenizer` differs from the loaded
    model's only for the growth models."""

    variant: str
    label: str
    description: str
    model: Any
    tokenizer: Any
    own_tokenizer: bool = False


def _layers(layers: Any) -> str:
    return ",".join(map(str, layers))


@contextlib.contextmanager
def subject(name: str, settings: EvaluateSettings, context: RunContext) -> Iterator[Subject]:
    """The variant `name` of the loaded model for the block (weights put back afterwards), or a
    model loaded for it; one line when the session lacks what it is made from."""
    from engine.models.anatomy import LayerStack
    from engine.models.pruning import removed

    loaded = context.needed_model("evaluate")
    model, tokenizer = loaded.model, loaded.tokenizer
    if name == "original":
        yield Subject(name, name, f"{loaded.name}, {loaded.n_layers} layers", model, tokenizer)
    elif name == "pruned":
        layers = settings.remove or pruned_layers(context.input(PruneResult))
        if not layers:
            raise UserError("variant pruned: no prune result with a layer cut in this session (block cuts are "
                            "scored by prune --evaluate-tasks); run `anatomy-tui run prune` or give --remove LAYERS")
        where = "" if settings.remove else " (the session's prune cut)"
        with removed(model, layers):
            yield Subject(name, f"pruned -{_layers(layers)}", f"layers {_layers(layers)} removed{where}",
                          model, tokenizer)
    elif name == "healed":
        folder = _healed_folder(context.input(PruneResult))
        with _loaded_folder(folder, loaded) as other:
            yield Subject(name, name, f"the healed cut the session's prune run exported to {folder}",
                          other.model, other.tokenizer)
    elif name == "recovered":
        saved = context.folder_of("recovery", LAYER_WEIGHTS)  # its row's reads_folders
        weights = layer_weights(saved, loaded.name) if saved is not None else {}
        if not weights:
            raise UserError("variant recovered: no recovered layer of this model in the session "
                            "(anatomy-tui run recovery, or key i in the console)")
        with LayerStack(model).holding(weights):
            yield Subject(name, name, f"layers {_layers(sorted(weights))} as the recovery run fine-tuned them",
                          model, tokenizer)
    else:  # growth, uniform
        path = None if context.output_dir is None else saved_model_path(context.input(GrowthResult), name,
                                                                         context.output_dir)
        if path is None:
            raise UserError(f"variant {name}: no {name} model in this session (anatomy-tui run growth)")
        from engine.experiments.growth.architecture import load_growth_model

        other, chars = load_growth_model(path)
        yield Subject(name, name, f"the growth run's {name} model ({path})", other, chars.transformers(),
                      own_tokenizer=True)


def _healed_folder(result: PruneResult | None) -> Path:
    if result is None or result.heal is None or not result.exported or not Path(result.exported).is_dir():
        raise UserError("variant healed: the session has no healed cut exported (anatomy-tui run prune "
                        "--heal-steps N --export DIR), or give --folder DIR")
    return Path(result.exported)


@contextlib.contextmanager
def _loaded_folder(folder: Path, loaded: Any) -> Iterator[Any]:
    """A Hugging Face folder loaded on the loaded model's device and dtype, freed after the block."""
    from engine.models.loading import load_model

    other = load_model(str(folder), device=loaded.device, dtype=loaded.dtype_name)
    try:
        yield other
    finally:
        del other


@contextlib.contextmanager
def _adapted(settings: EvaluateSettings, context: RunContext) -> Iterator[Subject]:
    """The loaded model (cut by --remove when given) with the PEFT adapter in `settings.adapter`,
    unloaded afterwards (the base weights were never changed)."""
    from peft import PeftModel
    from safetensors import SafetensorError

    from engine.models.pruning import removed
    from engine.models.sources import safetensors_only

    loaded = context.needed_model("evaluate")
    adapter = settings.adapter
    assert adapter is not None  # the adapter subject is asked for with --adapter alone
    # peft has no use_safetensors: it reads adapter_model.safetensors when the folder has one, and
    # safetensors_only refuses a folder without it before peft could fall back to torch.load
    safetensors_only(Path(adapter), adapter=True, what=f"--adapter {adapter}")
    with removed(loaded.model, settings.remove) if settings.remove else contextlib.nullcontext():
        try:
            peft_model = PeftModel.from_pretrained(loaded.model, adapter)
        except SafetensorError as exc:
            raise UserError(f"--adapter {settings.adapter}: adapter_model.safetensors is damaged or truncated "
                            f"({' '.join(str(exc).split())[:120]}); copy or export it again") from None
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"--adapter {settings.adapter}: not a PEFT adapter of this model "
                            f"({' '.join(str(exc).split())[:200]})") from None
        try:
            cut = f" on layers {_layers(settings.remove)} removed" if settings.remove else ""
            yield Subject("adapter", f"adapter {settings.adapter}", f"PEFT adapter {settings.adapter}{cut}",
                          peft_model.get_base_model(), loaded.tokenizer)
        finally:
            peft_model.unload()


def _subjects(settings: EvaluateSettings) -> list[str]:
    return list(settings.variants) + (["folder"] if settings.folder else []) + (["adapter"] if settings.adapter else [])


@contextlib.contextmanager
def _any_subject(name: str, settings: EvaluateSettings, context: RunContext) -> Iterator[Subject]:
    if name == "folder":
        assert settings.folder is not None  # the folder subject is asked for with --folder alone
        with _loaded_folder(Path(settings.folder), context.model) as other:
            yield Subject("folder", f"folder {settings.folder}", f"the exported model in {settings.folder}",
                          other.model, other.tokenizer)
    elif name == "adapter":
        with _adapted(settings, context) as found:
            yield found
    else:
        with subject(name, settings, context) as found:
            yield found


def _kept_rows(earlier: EvaluateResult | None, model: str, protocol: Any, gen_tokens: int,
               labels: set[str]) -> tuple[list[EvaluatedModel], str]:
    """The earlier evaluation's rows this run keeps (same model, protocol and check; other labels),
    and a note when it had rows it cannot keep."""
    if earlier is None:
        return [], ""
    same = (earlier.model == model and earlier.gen_tokens == gen_tokens and earlier.prompts == list(PROMPTS)
            and _comparable(earlier.protocol) == _comparable(protocol))
    if not same:
        return [], "the session's earlier evaluation used another model or protocol; it is replaced"
    return [row for row in earlier.models if row.label not in labels], ""


def _comparable(protocol: Any) -> tuple[Any, ...]:
    return (list(protocol.tasks), protocol.batch_size, protocol.limit, protocol.num_fewshot, protocol.include_path,
            protocol.lm_eval_version)


def run(settings: EvaluateSettings, context: RunContext) -> Iterator[Event]:
    settings.validate()
    started = time.perf_counter()
    loaded = context.needed_model("evaluate")
    if isinstance(loaded, StreamedModel):  # --stream, or only streaming fits: the perplexity, streamed
        yield from streamed_run(settings, context, loaded)
        return
    harness = Harness(settings.tasks, settings.batch_size, settings)
    names = _subjects(settings)
    reference = (continuations(loaded.model, loaded.tokenizer, settings.gen_tokens)
                 if settings.gen_tokens else None)
    rows: list[EvaluatedModel] = []
    for index, name in enumerate(names):
        context.cancel.check()
        yield Progress(index, len(names), f"evaluate: {name}", phase="evaluation", unit="models")
        began = time.perf_counter()
        with _any_subject(name, settings, context) as found:
            scores = harness.scores(found.model, found.tokenizer)
            check = None
            if reference is not None:
                ids = continuations(found.model, found.tokenizer, settings.gen_tokens)
                check = generation_check(loaded.tokenizer, reference, ids,
                                         found.tokenizer if found.own_tokenizer else None)
            n_layers = int(found.model.config.num_hidden_layers)
        row = EvaluatedModel(variant=found.variant, label=found.label, description=found.description,
                             n_layers=n_layers, scores=scores, generation=check,
                             seconds=time.perf_counter() - began)
        rows.append(row)
        yield ModelEvaluated(row.variant, row.label, scores, check)
    yield Progress(len(names), len(names), "evaluate", phase="evaluation", unit="models")
    protocol = harness.protocol()
    earlier = context.input(EvaluateResult)
    kept, note = _kept_rows(earlier, loaded.name, protocol, settings.gen_tokens, {row.label for row in rows})
    if earlier is None and EvaluateResult.name in context.inputs:
        note = "the session's earlier evaluation could not be read; it is replaced"
    if note:
        yield Message(note, "warning")
    if kept:
        yield Message(f"kept from the session's earlier evaluation: {', '.join(row.label for row in kept)}")
    ordered = sorted(kept + rows, key=lambda row: row.variant != "original")  # stable: the original first
    doc = EvaluateResult(model=loaded.name, protocol=protocol, prompts=list(PROMPTS), gen_tokens=settings.gen_tokens,
                         models=ordered, settings=settings, seconds=time.perf_counter() - started)
    yield Result("evaluate", json_safe(doc))
