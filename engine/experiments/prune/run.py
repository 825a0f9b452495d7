"""`prune`: which layers can go, judged five ways on the same model and texts, healed, exported.

Criteria (each gives, for every count n, the n layers to remove; layers indexed from 0):
- `angular` (Gromov et al. 2024): for each block of n consecutive layers starting at l, the angular
  distance arccos(cos(h_l, h_{l+n})) / pi between the input of layer l and the input of layer l+n
  (the last layer's output for l+n = depth), averaged over real tokens; the block with the
  smallest is removed.
- `angular_last` (Gromov et al. 2024 as published, PruneMe, short-transformers' block search): the
  same block measure of each text's (window's) last token only.
- `bi` (ShortGPT, Men et al. 2024): the n layers of lowest Block Influence 1 - cos(h_in, h_out).
- `ppl` (SLEB, Song et al. 2024): greedy; each round removes the layer whose removal raises the
  perplexity least, re-evaluated on the model already cut. A round evaluates each candidate from
  its own position on, through the prefix cache of the cut model.
- `map`: the session's ablation map, least degradation first.
- `last`: the last layers before the final norm (the baseline of Reassessing Layer Pruning).

With --unit block each criterion ranks the 2N attention and MLP blocks instead (LLM-Drop): angular,
angular_last and bi each block's residual stream before against after its addition, from the same
one forward; ppl greedy over the blocks; map the session's sublayer map (`ablation --part both`);
last the blocks from the end. A count n cuts blocks in that order until their parameters reach n
layers' worth, so layer and block cuts meet at equal removed parameters.

Every set of layers is then really removed (`engine.models.pruning`) and evaluated; with --heal-steps the
cut model is fine-tuned on training text (the layers next to each cut, or LoRA adapters on every
layer through `peft`, merged afterwards) and evaluated again on the same held-out texts. The
weights are put back exactly after each point. The depth law (exploratory) fits the `ppl` curve's
loss against remaining depth l to c / l^a + L0.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from engine.core.codec import json_safe
from engine.core.errors import UserError
from engine.core.events import Event, Message, Progress, Result
from engine.data.eval_data import comparable
from engine.evaluation.accuracy import Harness
from engine.evaluation.judging import CutJudge, accuracy_line
from engine.evaluation.perplexity import Batch, Evaluator, TextScores
from engine.evaluation.statistics import bootstrap_perplexity, spearman
from engine.experiments.ablation.meters import InfluenceMeter, PartMeter
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.context import RunContext
from engine.experiments.prune.criteria import (
    PROXIES,
    AngularMeter,
    block_cuts,
    block_order,
    criterion_layers,
    cut_name,
    greedy_ppl,
    layers_worth,
    map_degradation,
    point_cut,
    units_of,
)
from engine.experiments.prune.depth_law import depth_law
from engine.experiments.prune.export import adapter_folder, export_cut
from engine.experiments.prune.healing import CutWeights, Healer, holding
from engine.experiments.prune.replace import check_foldable, estimate, folded
from engine.experiments.prune.vocabulary import (
    BLOCK_METHODS,
    PruneCut,
    PrunedBlock,
    PruneHeal,
    PrunePoint,
    PruneResult,
    PruneScores,
    PruneSettings,
    check_run,
    replaced_label,
)
from engine.export.folder import check_export_folder
from engine.models.anatomy import LayerStack
from engine.models.families import PARTS, Block
from engine.models.pruning import (
    Cut,
    cut_layers,
    cut_removed,
    is_block_cut,
    layer_params,
    removed,
    removed_params,
    split_cut,
)


def cut_scores(evaluator: Evaluator, cut: Cut) -> TextScores:
    """Per-text scores with the cut's layers (or blocks) removed; the layers below the first one it
    touches come from the cache."""
    with cut_removed(evaluator.model, cut):
        return evaluator.scores(min(cut_layers(cut)))


def run(settings: PruneSettings, context: RunContext) -> Iterator[Event]:
    settings.validate()
    if context.model is None:
        raise UserError("prune needs a model")
    started = time.perf_counter()
    loaded, cancel = context.model, context.cancel
    model, tokenizer = loaded.model, loaded.tokenizer
    stack = LayerStack(model)
    n = len(stack)
    counts = settings.counts(n)
    methods = list(settings.methods())
    blocks = settings.unit == "block"
    ablation = context.input(AblationMap)
    degradation = map_degradation(ablation, blocks)
    ablation_model = ablation.model if ablation is not None else None
    if degradation and ablation_model not in (None, "", loaded.name):
        degradation = {}
        yield Message(f"the session's ablation map is for {ablation_model}, not {loaded.name}; not used", "warning")
    if "map" in methods and (set(degradation) != set(units_of(n, blocks))):
        if settings.method == "map":
            raise UserError("--method map needs the session's ablation map of this model; run `anatomy-tui run "
                            f"ablation{' --part both' if blocks else ''}` in the session first")
        methods.remove("map")
        yield Message("no ablation map of this model in the session: the map criterion is left out", "warning")
    export = check_export_folder(settings.export, settings.force) if settings.export else None
    export_count = (settings.export_count or counts[-1]) if export is not None else None
    healer = None
    if settings.heal_steps:
        try:
            healer = Healer(model, tokenizer, settings)
        except ImportError:
            raise UserError("healing needs training text: the built-in corpus (pydoc_data) is missing here; "
                            "give --train-file or --calib-dataset") from None

    calibration, calibration_tokens = None, 0
    if settings.replace:
        check_run(n, counts[-1], settings.replace[0])
        check_foldable(model)
        try:
            calibration = healer.blocks if healer is not None else settings.training_blocks(tokenizer)[0]
        except ImportError:
            raise UserError("--replace needs calibration text: the built-in corpus (pydoc_data) is missing here; "
                            "give --train-file or --calib-dataset") from None
        calibration_tokens = int(calibration.numel())

    harness = (Harness(settings.evaluate_tasks, settings.evaluate_batch_size, settings)
               if settings.evaluate_tasks else None)  # tasks checked before the slow part
    texts = settings.eval_source(tokenizer)
    evaluator = Evaluator.for_settings(model, tokenizer, settings, texts, cancel=cancel)
    if "map" in methods and (differs := comparable((ablation.protocol if ablation is not None else None) or None,
                                                   evaluator.protocol)):
        yield Message(f"the session's ablation map (the map criterion) and this run: {differs}", "warning")
    influence = InfluenceMeter(n)
    angular = AngularMeter(n, sorted({1, *counts})) if "angular" in methods and not blocks else None
    part_meter = PartMeter(stack, PARTS) if blocks else None

    def observe(batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        influence(batch, index, layer_input, layer_output)
        if angular is not None:
            angular(batch, index, layer_input, layer_output)
        if part_meter is not None:
            part_meter(batch, index, layer_input, layer_output)

    with stack.capture_parts(part_meter.term) if part_meter is not None else contextlib.nullcontext():
        base = evaluator.build_cache(observe=observe)
    baseline = base.perplexity
    bi, _ = influence.means()
    last_blocks = influence.last_token_blocks()
    yield Message(f"baseline PPL {baseline:.3f} on {evaluator.n_tokens} tokens")
    judge = CutJudge(harness, model, tokenizer, settings.gen_tokens) if harness is not None else None
    if judge is not None:
        yield Message(f"baseline accuracy: {accuracy_line(judge.baseline)}")

    greedy: list[Any] = []  # layers, or (layer, part) blocks (greedy_ppl)
    single: list[float] = []
    if "ppl" in methods:
        target = math.ceil(layers_worth(model, counts[-1])) if blocks else counts[-1]
        greedy, single = yield from greedy_ppl(model, tokenizer, texts, settings, target, cancel,
                                               evaluator.batch_size)
    if blocks:  # each block's proxies, in units_of order
        assert part_meter is not None  # measured with blocks
        proxies = part_meter.means()
        scores: dict[str, np.ndarray | None] = {m: np.array([proxies[b][i] for b in units_of(n, True)])
                                                for m, i in PROXIES.items()}
    else:
        scores = {"angular": angular.distances(1) if angular is not None else None, "bi": bi,
                  "angular_last": last_blocks[1]}
    scores |= {"ppl": np.array(single) if single else None, "last": None,
               "map": np.array([degradation[u] for u in units_of(n, blocks)]) if "map" in methods else None}
    for method in methods:
        if (values := scores[method]) is not None:
            yield PruneScores(method, [float(v) for v in values])

    chosen: dict[str, Mapping[int, Cut]]
    if blocks:
        chosen = {m: block_cuts(model, block_order(m, n, proxies=proxies, greedy=greedy, degradation=degradation),
                                counts) for m in methods}
    else:
        chosen = {m: criterion_layers(m, counts, bi=bi, angular=angular, greedy=greedy, degradation=degradation,
                                      last_blocks=last_blocks) for m in methods}
    sizes = layer_params(model)
    # the curves: each criterion's cut, then each block criterion's foldable block replaced (ReplaceMe)
    rows = [(m, m, None) for m in methods] + [(replaced_label(m, how), m, how) for m in methods
                                              if m in BLOCK_METHODS for how in settings.replace]
    for label, method, how in rows:
        if how is not None and label not in chosen:
            chosen[label] = criterion_layers(method, counts, bi=bi, angular=angular, greedy=greedy,
                                             degradation=degradation, last_blocks=last_blocks, foldable=True)
    # keyed by the cut, or a replaced cut's layers and how (as CutJudge is)
    measured: dict[tuple[Any, ...], TextScores] = {}
    healed: dict[Cut, float] = {}
    replaced: dict[tuple[Any, ...], CutWeights] = {}
    curve: list[PruneCut] = []
    best_export: tuple[float, PruneCut, CutWeights | None] | None = None
    # LoRA healing of each cut that may be exported saves its adapter here, until the export copies it
    adapters = (tempfile.TemporaryDirectory(prefix="anatomy-tui-lora-")
                if export is not None and healer is not None and settings.heal == "lora" else None)
    total = len(rows) * len(counts)
    for m_index, (label, _, how) in enumerate(rows):
        for c_index, count in enumerate(counts):
            if cancel is not None:
                cancel.check()
            layers = chosen[label][count]
            key: tuple[Any, ...] = layers if how is None else (*layers, how)
            if key not in measured and how is not None:
                assert not is_block_cut(layers)  # a replaced cut is a run of layers (criterion_layers)
                assert calibration is not None  # read when --replace is given
                began = time.perf_counter()
                transform = estimate(model, calibration, layers[0], count, how, evaluator.batch_size, settings.seed,
                                     cancel)
                replaced[key] = CutWeights(folded(model, layers[0] - 1, transform))
                fitted = time.perf_counter() - began
                with holding(model, replaced[key]), removed(model, layers):
                    measured[key] = evaluator.scores(layers[0] - 1)  # below the folded layer: the cache
                    if judge is not None:
                        judge.cut(model, key)
                yield Message(f"{label} -{count}: layers {layers[0]}-{layers[-1]} replaced by a {how} map folded "
                              f"into layer {layers[0] - 1} (fitted on {calibration_tokens} tokens in {fitted:.1f} s)")
            elif key not in measured:
                measured[key] = cut_scores(evaluator, layers)
            point_scores = measured[key]
            ppl = point_scores.perplexity
            low = high = None
            if settings.bootstrap:
                low, high = bootstrap_perplexity(point_scores.nll, point_scores.tokens, settings.bootstrap,
                                                 settings.seed + count)
            if judge is not None and how is None:
                with cut_removed(model, layers):
                    judge.cut(model, key)
            healed_ppl, weights = healed.get(layers), replaced.get(key)
            if how is None and healer is not None and layers not in healed:  # the same cut heals the same way
                adapter = adapter_folder(adapters, layers) if count == export_count else None
                with cut_removed(model, layers), healer.healed(layers, cancel, keep=count == export_count,
                                                               adapter=adapter) as weights:
                    healed_ppl = healed[layers] = evaluator.perplexity()
                    if judge is not None:
                        judge.healed(model, key)  # how is None: the key is the cut
            if how is not None:
                healed_ppl = None  # ReplaceMe needs no training: its rows are not healed
            # --unit block's cuts are blocks (block_cuts), --unit layer's layers
            block_cut: tuple[Block, ...] = layers if is_block_cut(layers) else ()
            layer_cut: tuple[int, ...] = () if is_block_cut(layers) else layers
            whole = split_cut(block_cut)[0] if blocks else layer_cut
            params = removed_params(model, block_cut) if blocks else sum(sizes[i] for i in layer_cut)
            if blocks:
                yield Message(f"{label} -{count} layers' worth ({layers_worth(model, count):.0f} parameters): "
                              f"blocks {cut_name(layers)} ({params} parameters)")
            pruned: dict[str, Any] = {"blocks": [PrunedBlock(*b) for b in block_cut]} if blocks else {}
            point = PruneCut(method=label, removed=count, layers=list(whole), ppl=ppl, ci_low=low, ci_high=high,
                             healed_ppl=healed_ppl, **(judge.row(key, ppl, baseline) if judge is not None else {}),
                             removed_params=params, **pruned)
            if judge is not None:
                yield Message(f"{label} -{count}: accuracy {accuracy_line(point.accuracy)}"
                              + (f"; {point.disagreement}" if point.disagreement else ""),
                              "warning" if point.disagreement else "info")
            curve.append(point)
            yield PrunePoint(label, count, list(whole), ppl, baseline, low, high, healed_ppl)
            yield Progress(m_index * len(counts) + c_index + 1, total, f"prune: {label}", unit="cuts")
            final = healed_ppl if healed_ppl is not None else ppl
            wanted = settings.export_method in (None, label)
            if (count == export_count and wanted and math.isfinite(final)
                    and (best_export is None or final < best_export[0])):
                best_export = (final, point, weights)

    exported = str(export) if export is not None and best_export is not None else None

    ppl_points = [(0, base)] + [(p.removed, measured[point_cut(p)]) for p in curve if p.method == "ppl"]
    depth_fit = depth_law(n, ppl_points, settings.bootstrap, settings.seed) if "ppl" in methods and not blocks else None
    if "ppl" in methods and not blocks and depth_fit is None:
        yield Message("depth law: fewer than 4 usable points on the ppl curve; not fitted", "warning")
    ppl_scores = scores["ppl"]
    agreement = {m: spearman(values, ppl_scores) for m in methods
                 if m != "ppl" and ppl_scores is not None and (values := scores[m]) is not None}
    doc = PruneResult(
        model=loaded.name,
        baseline_ppl=baseline,
        eval_tokens=evaluator.n_tokens,
        eval_texts=evaluator.n_texts,
        n_layers=n,
        settings=settings,
        methods=methods,
        curve=curve,
        agreement=agreement,
        agreement_note=("the same, per block (--unit block): " if blocks else "") +
                       "Spearman between each criterion's per-layer score (angular: distance over one "
                       "layer, all tokens; angular_last: the same, last token; bi: Block Influence; map: D%) "
                       "and the perplexity with that single layer removed (the ppl criterion's first round)",
        scores={m: [float(v) for v in values] for m in methods if (values := scores[m]) is not None},
        depth_fit=depth_fit,
        heal=(PruneHeal(steps=settings.heal_steps, what=settings.heal, train_source=healer.source,
                        train_blocks=len(healer.blocks)) if healer is not None else None),
        exported=exported,
        exported_point=best_export[1] if exported and best_export is not None else None,
        seconds=time.perf_counter() - started,
        protocol=evaluator.protocol,
        **(judge.result() if judge is not None else {}),
    )
    if exported is not None and best_export is not None:  # exported: a best cut was kept
        yield from export_cut(doc, best_export, loaded, settings, adapters)
    yield Result("prune", json_safe(doc))
