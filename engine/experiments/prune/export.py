"""prune's export: the chosen cut saved as a Hugging Face folder (its healed or folded weights held
in), with its model card, the mergekit configuration of the same cut and, after LoRA healing, the
adapter; and what each criterion's name means, in words, for the card."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.codec import ABSENT, json_safe
from engine.core.events import Event
from engine.experiments.prune.criteria import cut_name, point_cut
from engine.experiments.prune.healing import CutWeights, holding
from engine.experiments.prune.vocabulary import HEAD_AND_LAST, PruneCut, PruneExported, PruneResult, PruneSettings
from engine.export.folder import ADAPTER, save_model_folder
from engine.export.mergekit_yaml import MERGEKIT_CONFIG, passthrough_yaml
from engine.export.model_card import CardFacts, Perplexity, hub_id, model_card
from engine.models.pruning import Cut, is_block_cut, outputs_zeroed, removed, split_cut

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

    from engine.models.loading import LoadedModel


WHY = {
    "angular": "the block of consecutive layers whose input and output hidden states are closest in angle "
               "(averaged over all tokens)",
    "angular_last": "the block of consecutive layers whose input and output hidden states are closest in angle "
                    "at the last token (Gromov et al.)",
    "bi": "the layers of lowest Block Influence (1 - cosine between a layer's input and output)",
    "ppl": "greedy removal of the layer whose removal raised perplexity least, re-evaluated after each removal",
    "map": "the layers of least degradation in the session's ablation map",
    "last": "the last layers before the final norm (the baseline of Reassessing Layer Pruning, ICLR 2026)",
}
REPLACED = {"linear": "replaced by one linear map fitted by least squares to calibration activations and folded "
                      "into the MLP output projection of the layer before the cut (ReplaceMe)",
            "linear-cosine": "replaced by one linear map fitted by Adam on the cosine distance to calibration "
                             "activations and folded into the MLP output projection of the layer before the cut "
                             "(ReplaceMe's cosine variant)"}


WHY_BLOCKS = {
    "angular": "the attention and MLP blocks whose residual stream before and after their addition is closest "
               "in angle (averaged over all tokens; LLM-Drop)",
    "angular_last": "the attention and MLP blocks whose residual stream before and after their addition is "
                    "closest in angle at the last token",
    "bi": "the attention and MLP blocks of lowest Block Influence (1 - cosine between the residual stream before "
          "and after their addition)",
    "ppl": "greedy removal of the attention or MLP block whose removal raised perplexity least, re-evaluated "
           "after each removal",
    "map": "the attention and MLP blocks of least degradation in the session's sublayer map",
    "last": "the last attention and MLP blocks before the final norm",
}


def why(label: str, blocks: bool = False) -> str:
    """What a curve's name means: a criterion (on blocks, with --unit block), or a criterion's run of
    layers replaced (`angular+linear`)."""
    method, _, how = label.partition("+")
    return (WHY_BLOCKS if blocks else WHY)[method] + (f", {REPLACED[how]}" if how else "")


def _card(result: PruneResult, point: PruneCut, loaded: LoadedModel, settings: PruneSettings,
          reason: str) -> ModelCard:
    """The exported cut's card: the run's result (its perplexity `protocol`, and with
    --evaluate-tasks lm-eval's accuracies and protocol, go into the metadata as they are written)."""
    def written(value: Any) -> Any:  # a field as the result's JSON has it; absent: None
        return None if value is ABSENT else json_safe(value)

    n_layers = result.n_layers
    protocol = written(result.protocol)
    texts = str(result.protocol.dataset if result.protocol else settings.eval_file or f"builtin:{settings.eval_set}")
    healed = point.healed_ppl
    lora = settings.heal == "lora" and healed is not None
    healing = None if healed is None else {
        "method": settings.heal, "steps": settings.heal_steps, "lr": settings.lr,
        "train_source": result.heal.train_source if result.heal is not None else None,
        **({"lora_rank": settings.lora_rank, "lora_alpha": 2 * settings.lora_rank,
            "adapter": ADAPTER + "/" if not settings.export_adapter else "."} if lora else {}),
    }
    exported = result.exported_point
    cut_field = (lambda name: written(getattr(exported, name))) if exported is not None else (lambda name: None)
    accuracy = cut_field("healed_accuracy") if healed is not None else cut_field("accuracy")
    lm_eval = {key: value for key, value in (("protocol", written(result.evaluation)),
                                             ("original", written(result.baseline_accuracy)),
                                             ("pruned", cut_field("accuracy")),
                                             ("healed", cut_field("healed_accuracy")),
                                             ("generation", cut_field("generation")),
                                             ("disagreement", cut_field("disagreement"))) if value is not None}
    blocks = [(b.layer, b.part) for b in point.blocks or ()]
    zeroed = split_cut(blocks)[1] if blocks else ()
    kept = n_layers - len(point.layers)
    details = {
        "experiment": "prune", "source_model": loaded.name, "source_num_hidden_layers": n_layers,
        "num_hidden_layers": kept, "removed_layers": list(point.layers),
        **({"removed_blocks": [{"layer": b[0], "part": b[1]} for b in blocks],
            "zeroed_blocks": [{"layer": b[0], "part": b[1]} for b in zeroed]} if blocks else {}),
        **({"removed_parameters": point.removed_params} if point.removed_params else {}),
        "criterion": point.method, "criterion_definition": why(point.method, bool(blocks)),
        "criteria_compared": result.methods,
        "healing": healing,
        "perplexity": {"original": result.baseline_ppl, "pruned": point.ppl,
                       "pruned_ci95": [point.ci_low, point.ci_high] if point.ci_low is not None else None,
                       "healed": healed,
                       "texts": texts, "eval_tokens": result.eval_tokens, "protocol": protocol},
        **({"lm_eval": lm_eval} if accuracy else {}),
        **({} if blocks else {"mergekit_config": MERGEKIT_CONFIG}),
    }
    removed_text = (f"attention and MLP blocks {', '.join(f'{layer} {part}' for layer, part in blocks)} "
                    f"({point.removed_params} parameters, {point.removed} layers' worth; layers removed whole: "
                    f"{', '.join(map(str, point.layers)) or 'none'})" if blocks
                    else ", ".join(map(str, point.layers)))
    heal = ("Not healed." if healed is None else
            f"Healed afterwards with {settings.heal_steps} steps of AdamW (lr {settings.lr:g}) on "
            + ("the layers next to each cut" if settings.heal == "adjacent"
               else f"the LM head and the last {HEAD_AND_LAST} kept layers" if settings.heal == "last"
               else f"LoRA adapters of rank {settings.lora_rank} on every layer")
            + f": perplexity {point.ppl:.3f} -> {healed:.3f}.")
    merged = ("" if not lora else
              f"`{ADAPTER}/` holds the LoRA adapter in PEFT's format, already merged into these weights.\n")
    if blocks:
        load = (f"Load with `AutoModelForCausalLM.from_pretrained(folder)`: `num_hidden_layers` is {kept} (the "
                "layers that lost both blocks are gone). Each other removed block is zeroed, not dropped: its "
                "output projection's weight and bias are zero (attention's, the MLP's down projection), so it adds "
                f"nothing to the residual stream but still costs its compute, since {loaded.family} in "
                "transformers has no config that drops one block of a layer.\n" + merged)
    elif settings.export_adapter:
        load = (f"This folder holds only the healing's LoRA adapter (PEFT's format: `adapter_config.json`, "
                "`adapter_model.safetensors`), for the cut model. Make the cut with mergekit "
                f"(`mergekit-yaml {MERGEKIT_CONFIG} base`), then load "
                "`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained('base'), folder)`.")
    else:
        load = (f"Load with `AutoModelForCausalLM.from_pretrained(folder)`: `num_hidden_layers` is "
                f"{kept} and the per-layer config lists hold the kept layers, in order.\n{merged}"
                f"`{MERGEKIT_CONFIG}` makes the same cut of the original with mergekit "
                f"(`mergekit-yaml {MERGEKIT_CONFIG} OUT`){'; the healing is not in it' if healed is not None else ''}"
                f"{'; the folded linear map is not in it' if '+' in point.method else ''}.")
    body = (f"Exported by anatomy-tui (`prune`). Removed {'' if blocks else 'layers '}"
            f"(0-based indices of the original model): "
            f"{removed_text}.\n\nChosen by the `{point.method}` criterion: {reason}.\n\n"
            f"Perplexity on {texts} ({result.eval_tokens} tokens"
            + (f", protocol `{protocol.get('protocol')}`" if protocol else "")
            + f"): {result.baseline_ppl:.3f} before the cut, {point.ppl:.3f} after. {heal}\n\n{load}\n")
    final = healed if healed is not None else point.ppl
    return model_card(CardFacts(
        title=(f"{loaded.name or 'model'} with {len(blocks)} attention/MLP blocks removed ({point.removed} layers' "
               f"worth)" if blocks else f"{loaded.name or 'model'} with {point.removed} of {n_layers} layers removed"),
        body=body, details=details, base_model=hub_id(loaded.name, loaded.source),
        tags=["pruned", "block-pruning" if blocks else "layer-pruning", point.method.partition("+")[0],
              *(["replaceme"] if "+" in point.method else []), *(["healed"] if healed is not None else [])],
        perplexity=Perplexity(final, texts, protocol) if final is not None else None,
        library="peft" if settings.export_adapter else "transformers",
        accuracy=accuracy or (), n_shot=result.evaluation.n_shot if result.evaluation else None,
    ))


def adapter_folder(adapters: tempfile.TemporaryDirectory[str] | None, cut: Cut) -> Path | None:
    """Where LoRA healing saves the adapter of this cut, when the run exports adapters."""
    return None if adapters is None else Path(adapters.name) / cut_name(cut)


def export_cut(doc: PruneResult, best: tuple[float, PruneCut, CutWeights | None],
               loaded: LoadedModel, settings: PruneSettings,
               adapters: tempfile.TemporaryDirectory[str] | None) -> Iterator[Event]:
    """The chosen cut (healed: its trained layers' weights) saved with its card, the mergekit
    configuration of the cut and, after LoRA healing, the adapter (or only the adapter)."""
    final, point, weights = best
    assert doc.exported is not None  # export_cut runs when the result names its folder
    cut = point_cut(point)
    whole, alone = split_cut(cut) if is_block_cut(cut) else (cut, ())  # blocks: the point's, when it has them
    worth = " layers' worth of parameters in attention and MLP blocks" if point.blocks else " layers"
    reason = why(point.method, bool(point.blocks)) + (f"; of the criteria compared ({', '.join(doc.methods)}), "
                                                      f"its cut of {point.removed}{worth} gave the lowest perplexity")
    files = {} if point.blocks else {MERGEKIT_CONFIG: passthrough_yaml(loaded.source, doc.n_layers, point.layers,
                                                                       loaded.dtype_name)}
    adapter = adapter_folder(adapters, cut) if point.healed_ppl is not None else None
    try:  # a block removed alone: its output projection zeroed (original indices, before the layers go)
        with holding(loaded.model, weights), outputs_zeroed(loaded.model, alone), removed(loaded.model, whole):
            save_model_folder(loaded.model, loaded.tokenizer, doc.exported,
                              _card(doc, point, loaded, settings, reason), settings.force,
                              files=files, adapter=adapter, weights=not settings.export_adapter)
    finally:
        if adapters is not None:
            adapters.cleanup()
    yield PruneExported(doc.exported, point.method, point.layers, final)
