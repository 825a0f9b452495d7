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
import dataclasses
import math
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engine.core.codec import ABSENT, json_safe
from engine.core.errors import UserError
from engine.core.events import Event, Message, Progress, Result
from engine.data.eval_data import EvalSource, comparable
from engine.evaluation.accuracy import CutJudge, Harness, accuracy_line
from engine.evaluation.perplexity import Batch, Evaluator, TextScores, masked
from engine.evaluation.statistics import bootstrap_perplexity, spearman
from engine.experiments.ablation.run import InfluenceMeter, PartMeter
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.context import RunContext
from engine.experiments.prune.replace import admissible, check_foldable, estimate, folded
from engine.experiments.prune.vocabulary import (
    BLOCK_METHODS,
    CHINCHILLA_A_L,
    HEAD_AND_LAST,
    DepthLaw,
    PruneCut,
    PrunedBlock,
    PruneExported,
    PruneHeal,
    PrunePoint,
    PruneResult,
    PruneScores,
    PruneSettings,
    check_run,
    replaced_label,
)
from engine.export.folder import ADAPTER, check_export_folder, save_model_folder
from engine.export.mergekit_yaml import MERGEKIT_CONFIG, passthrough_yaml
from engine.export.model_card import CardFacts, Perplexity, hub_id, model_card
from engine.models.anatomy import PARTS, LayerStack, execution_device, host_copies
from engine.models.pruning import (
    Block,
    Cut,
    cut_layers,
    cut_removed,
    is_block_cut,
    layer_params,
    outputs_zeroed,
    removed,
    removed_params,
    split_cut,
)
from engine.training.trainer import (
    FINE_TUNE_ADVICE,
    FINE_TUNE_SCALE,
    Trainer,
    blocks_forward,
    next_token_loss,
    seeded_batches,
)

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

    from engine.models.loading import LoadedModel





# --- reading the ablation map ---------------------------------------------------------------------


def map_degradation(ablation: AblationMap | None, blocks: bool = False) -> dict:
    """Layer -> D% from the session's ablation map (rows without a D% left out); with `blocks`,
    (layer, part) -> D% from its sublayer rows (`ablation --part`)."""
    if ablation is None:
        return {}
    if blocks:
        return {(row.layer, row.part): float(row.degradation_pct) for row in ablation.parts or ()
                if row.degradation_pct is not None}
    return {row.layer: float(row.degradation_pct) for row in ablation.layers if row.degradation_pct is not None}


# --- the cheap criteria, from one pass ------------------------------------------------------------


class AngularMeter:
    """Angular distance between the inputs of layers l and l+n for each requested n, averaged over
    real tokens, gathered while the prefix cache is built (the layer inputs are already kept). The
    sums stay tensors on the states' device until `distances`: no host sync per batch."""

    def __init__(self, n_layers: int, blocks: Sequence[int]) -> None:
        self.n_layers = n_layers
        self.blocks = tuple(blocks)
        self.sums: dict[tuple[int, int], torch.Tensor] = {}
        self.count: torch.Tensor | int = 0
        self._states: list[torch.Tensor] = []

    def __call__(self, batch: Batch, index: int, layer_input: torch.Tensor, layer_output: torch.Tensor) -> None:
        self._states.append(layer_input)
        if index < self.n_layers - 1:
            return
        states = self._states + [layer_output]
        self._states = []
        self.count = self.count + batch.attention_mask.sum()
        for n in self.blocks:
            for start in range(self.n_layers - n + 1):
                first = states[start].float()
                cos = torch.nn.functional.cosine_similarity(first, states[start + n].to(first.device).float(), dim=-1)
                angle = torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi
                total = masked(angle, batch.attention_mask).sum().double()
                self.sums[n, start] = self.sums.get((n, start), 0) + total

    def distances(self, n: int) -> np.ndarray:
        """One host read for the row of sums (each sits on the GPU its first layer's states were on)."""
        row = [self.sums[n, start] for start in range(self.n_layers - n + 1)]
        return torch.stack([value.to(row[0].device) for value in row]).cpu().numpy() / float(self.count)


# --- evaluation of a cut ----------------------------------------------------------------------------


def cut_scores(evaluator: Evaluator, cut: Cut) -> TextScores:
    """Per-text scores with the cut's layers (or blocks) removed; the layers below the first one it
    touches come from the cache."""
    with cut_removed(evaluator.model, cut):
        return evaluator.scores(min(cut_layers(cut)))


def cut_name(cut: Cut) -> str:
    """A cut in a few characters: layers `14-15`, blocks `14a-15m` (attention, MLP)."""
    return "-".join(f"{b[0]}{b[1][0]}" if isinstance(b, tuple) else str(b) for b in cut)


def units_of(n_layers: int, blocks: bool) -> list:
    """What a criterion ranks: the layers, or with `blocks` every (layer, part) in the order they run."""
    return [(i, part) for i in range(n_layers) for part in PARTS] if blocks else list(range(n_layers))


def greedy_ppl(model, tokenizer, texts: EvalSource, settings: PruneSettings, target: int,
               cancel, batch_size: int) -> Iterator[Event]:
    """SLEB: greedy removals, `target` layers (with --unit block: blocks until their parameters
    reach `target`). Returns (the order of removal, the first round's perplexity of each single
    removal, in `units_of` order). Each round builds the prefix cache of the model cut so far and
    evaluates every remaining layer (block) from its layer's position, skipped (equal to removed;
    tested)."""
    blocks = settings.unit == "block"
    candidates = units_of(len(LayerStack(model)), blocks)
    order: list = []
    first: list[float] = []

    def reached() -> int:  # how far towards the target the order goes
        return min(removed_params(model, order), target) if blocks else len(order)

    while reached() < target:
        with cut_removed(model, tuple(order)) as kept:
            # sized once, by the caller
            evaluator = Evaluator(model, tokenizer, texts, batch_size, settings.max_length, cancel=cancel)
            evaluator.build_cache()
            rest = [unit for unit in candidates if unit not in order]
            trial = []
            for unit in rest:
                if cancel is not None:
                    cancel.check()
                position = kept.index(unit[0] if blocks else unit)
                with (evaluator.stack.part_skipped(position, unit[1]) if blocks
                      else evaluator.stack.skipped([position])):
                    trial.append(evaluator.perplexity(position))
            del evaluator
        if not order:
            first = trial
        best = int(np.argmin([p if math.isfinite(p) else math.inf for p in trial]))
        order.append(rest[best])
        yield Progress(reached(), target, "prune: ppl greedy search")
        yield Message(f"ppl round {len(order)}: remove {'block' if blocks else 'layer'} {cut_name((rest[best],))} "
                      f"(PPL {trial[best]:.3f})")
    return order, first


# --- healing -----------------------------------------------------------------------------------------


def neighbours_of_cuts(n_layers: int, layers: Sequence[int]) -> tuple[int, ...]:
    """Original indices of the kept layers right before and after each run of removed layers."""
    cut = set(layers)
    found = {i for c in cut for i in (c - 1, c + 1) if 0 <= i < n_layers and i not in cut}
    return tuple(sorted(found))


def last_kept(n_layers: int, layers: Sequence[int], count: int = HEAD_AND_LAST) -> tuple[int, ...]:
    """Original indices of the last `count` kept layers (--heal last trains them with the LM head)."""
    return tuple(i for i in range(n_layers) if i not in set(layers))[-count:]


@dataclasses.dataclass
class CutWeights:
    """What a healed or replaced cut changed, for its export: layers' tensors by the layers' own
    names ({original index: {name: tensor}}), and the LM head's weight (--heal last). A healed cut's
    are host copies queued from the GPU (`LayerStack.copies(queued=True)`): only ever copied back."""

    layers: dict[int, dict[str, torch.Tensor]]
    head: torch.Tensor | None = None


@contextlib.contextmanager
def holding(model, weights: CutWeights | None) -> Iterator[None]:
    """The model with these weights for the block, its own put back bit for bit afterwards."""
    if weights is None:
        yield
        return
    with LayerStack(model).holding(weights.layers), head_preserved(model, weights.head is not None):
        if weights.head is not None:
            with torch.no_grad():
                model.get_output_embeddings().weight.copy_(weights.head)
        yield


@contextlib.contextmanager
def head_preserved(model, active: bool = True) -> Iterator[None]:
    """The LM head's weight restored exactly on exit (tied to the input embedding: that too, the same tensor)."""
    if not active:
        yield
        return
    weight = model.get_output_embeddings().weight
    saved = weight.detach().to("cpu", copy=True, non_blocking=weight.is_cuda)  # queued: only copied back
    try:
        yield
    finally:
        with torch.no_grad():
            weight.copy_(saved)


class Healer:
    """Fine-tunes a cut model on the training half of the corpus (the split recovery uses)."""

    def __init__(self, model, tokenizer, settings: PruneSettings) -> None:
        self.model = model
        self.settings = settings
        self.stack = LayerStack(model)  # every layer, numbered as in the uncut model (a cut keeps the modules)
        self.dtype = model.dtype
        blocks, self.source = settings.training_blocks(tokenizer)  # --calib-dataset's windows, or the corpus
        self.blocks = blocks.to(self.stack.input_device())

    @contextlib.contextmanager
    def healed(self, cut: Cut, cancel, keep: bool = False,
               adapter: Path | None = None) -> Iterator[CutWeights | None]:
        """Inside `cut_removed(model, cut)`: the cut model fine-tuned for the block, then restored
        exactly (an offloaded layer it would train is refused first). With `keep`, yields the
        trained weights (CutWeights: layers by original index, queued to the CPU; the LM head with
        --heal last) for export; else None. With `adapter`, LoRA healing also saves its adapter there
        (PEFT's format, before it is merged). --heal last (Reassessing Layer Pruning) trains the LM
        head and the last three kept layers, nothing else. A block cut's adjacent healing trains
        the kept layers holding a removed block and the layers next to them."""
        heal = self.settings.heal
        n = len(self.stack)
        touched = cut_layers(cut)
        whole = split_cut(cut)[0] if is_block_cut(cut) else touched  # the layers that are gone
        trained = (tuple(sorted({i for i in touched if i not in whole} | set(neighbours_of_cuts(n, touched))))
                   if heal == "adjacent" else last_kept(n, whole) if heal == "last"
                   else tuple(i for i in range(n) if i not in whole))
        with self.stack.preserved(trained, host=heal == "lora"), head_preserved(self.model, heal == "last"):
            if heal == "lora":  # LoRA: the whole model's layers
                self._lora(trained[0], cancel, adapter)
            else:
                params = [p for i in trained for p in self.stack.layers[i].parameters()]
                if heal == "last":
                    params.append(self.model.get_output_embeddings().weight)
                self._train(params, trained[0], cancel)
            if not keep:
                yield None
            else:
                head = self.model.get_output_embeddings().weight if heal == "last" else None
                yield CutWeights(self.stack.copies(trained, host=True, queued=True),
                                 None if head is None else head.detach().to("cpu", copy=True,
                                                                            non_blocking=head.is_cuda))

    def _train(self, params: list[torch.nn.Parameter], layer: int, cancel) -> None:
        """`heal_steps` steps on the seeded batches; a non-finite loss ends the healing there."""
        settings = self.settings
        batches = seeded_batches(len(self.blocks), settings.batch_size, torch.Generator().manual_seed(settings.seed))
        with Trainer(params, execution_device(self.stack.layers[layer]), self.dtype, lr=settings.lr,
                     init_scale=FINE_TUNE_SCALE, what="prune healing", advice=FINE_TUNE_ADVICE) as trainer:
            for _ in range(settings.heal_steps):
                if cancel is not None:
                    cancel.check()
                ids = self.blocks[next(batches)]
                with trainer.forward():
                    loss = next_token_loss(blocks_forward(self.model, ids).logits, ids)
                if not math.isfinite(float(loss.detach())):
                    break
                trainer.step(loss)

    def _lora(self, layer: int, cancel, adapter: Path | None = None) -> None:
        """LoRA on every matrix of every kept layer, trained, saved to `adapter` (when given), then
        merged into the weights. The adapter's module names are the cut model's (layers renumbered
        from 0), so it loads onto the pruned base: it names no base model (the original is not it, and
        AutoPeftModel would load the original under it)."""
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise UserError("--heal lora needs peft: pip install 'peft>=0.10'") from None

        targets = sorted({path.rsplit(".", 1)[-1] for _, path in self.stack.spec.matrices})
        config = LoraConfig(r=self.settings.lora_rank, lora_alpha=2 * self.settings.lora_rank, lora_dropout=0.0,
                            target_modules=targets, bias="none")
        with torch.random.fork_rng(devices=[]):  # the adapters' initialisation seeded too: the same cut heals alike
            torch.manual_seed(self.settings.seed)
            peft_model = get_peft_model(self.model, config)
        try:
            self._train([p for name, p in peft_model.named_parameters() if "lora_" in name], layer, cancel)
            if adapter is not None:
                peft_model.peft_config["default"].base_model_name_or_path = ""  # not None: peft fills that in
                lora = {name: p for name, p in peft_model.state_dict().items() if "lora_" in name}
                peft_model.save_pretrained(adapter, state_dict=host_copies(lora))
        finally:
            peft_model.merge_and_unload()


# --- the depth law -----------------------------------------------------------------------------------


A_GRID = np.linspace(0.01, 10.0, 1999)  # exponents tried; powerfit's bound, 0.005 apart


def fit_depth(depths: np.ndarray, losses: np.ndarray) -> dict[str, np.ndarray]:
    """Least-squares fits of L = c / l^a + L0 (c, L0 >= 0), one per row of `losses` (R, N).

    For a fixed a the model is linear in (c, L0), so each a on a fine grid is solved in closed
    form and the best a kept: exact up to the grid, and a thousand bootstrap refits cost one
    array operation (powerfit's iterative fit is built for many more parameters)."""
    y = np.atleast_2d(losses)
    x = depths[None, :] ** -A_GRID[:, None]  # (G, N)
    xm, ym = x.mean(axis=1), y.mean(axis=1)
    centred = x - xm[:, None]
    c = np.einsum("gn,rn->rg", centred, y) / (centred**2).sum(axis=1)
    floor = ym[:, None] - c * xm[None, :]
    through_zero = floor < 0  # L0 would be negative: fit with L0 = 0
    c = np.where(through_zero, np.einsum("gn,rn->rg", x, y) / (x**2).sum(axis=1), c)
    floor = np.where(through_zero, 0.0, floor)
    flat = c < 0  # loss falls with depth removed: no depth term
    c, floor = np.where(flat, 0.0, c), np.where(flat, ym[:, None], floor)
    sse = ((c[:, :, None] * x[None] + floor[:, :, None] - y[:, None, :]) ** 2).sum(axis=2)
    best = sse.argmin(axis=1)
    rows = np.arange(y.shape[0])
    return {"a": A_GRID[best], "c": c[rows, best], "L0": floor[rows, best]}


def depth_law(n_layers: int, points: Sequence[tuple[int, TextScores]], resamples: int,
              seed: int) -> DepthLaw | None:
    """The `ppl` curve's loss (ln PPL) against remaining depth, fitted; ci95 from refits on
    bootstrap resamples of the evaluation texts. Exploratory: a pruned trained model is not a model
    trained at that depth."""
    depths = np.array([n_layers - removed_ for removed_, _ in points], dtype=float)
    nll = np.stack([scores.nll for _, scores in points])
    tokens = points[0][1].tokens
    losses = nll.sum(axis=1) / tokens.sum()
    if len(points) < 4 or not np.all(np.isfinite(losses)):
        return None
    fit = fit_depth(depths, losses)
    best = {key: float(value[0]) for key, value in fit.items()}
    ci = None
    if resamples:
        draws = np.random.default_rng(seed).integers(0, len(tokens), size=(resamples, len(tokens)))
        values = np.concatenate([  # in chunks: the grid search holds resamples x grid x points
            fit_depth(depths, nll[:, chunk].sum(axis=2).T / tokens[chunk].sum(axis=1)[:, None])["a"]
            for chunk in np.array_split(draws, max(1, resamples // 100))])
        ci = [float(v) for v in np.percentile(values, [2.5, 97.5])]
    return DepthLaw(
        **best, ci95=ci, points=len(depths), depths=depths.tolist(),
        label="exploratory: loss (ln PPL) of the ppl criterion's cuts against remaining depth l, "
              "fitted to c / l^a + L0; a pruned trained model is not a model trained at depth l",
        chinchilla=CHINCHILLA_A_L,
    )


# --- the run ---------------------------------------------------------------------------------------


def criterion_layers(method: str, counts: Sequence[int], *, bi: np.ndarray, angular: AngularMeter | None,
                     greedy: Sequence[int], degradation: dict[int, float],
                     last_blocks: dict[int, np.ndarray] | None = None,
                     foldable: bool = False) -> dict[int, tuple[int, ...]]:
    """The layers (original indices, sorted) each count removes under one criterion. With
    `foldable` (a block criterion for --replace), the best block that has a layer before it and
    stops before the last layer."""
    if method in BLOCK_METHODS:
        chosen = {}
        n_layers = len(bi)
        for n in counts:
            distances = np.asarray(angular.distances(n) if method == "angular" else last_blocks[n], dtype=float)
            if foldable:
                distances = np.array([d if admissible(n_layers, start, n) else np.inf
                                      for start, d in enumerate(distances)])
            start = int(np.argmin(distances))
            chosen[n] = tuple(range(start, start + n))
        return chosen
    if method == "last":  # the last layers before the final norm (the baseline of Reassessing Layer Pruning)
        return {n: tuple(range(len(bi) - n, len(bi))) for n in counts}
    if method == "bi":
        order = [int(i) for i in np.argsort(bi, kind="stable")]
    elif method == "map":
        order = sorted(degradation, key=lambda layer: (degradation[layer], layer))
    else:
        order = list(greedy)
    return {n: tuple(sorted(order[:n])) for n in counts}


PROXIES = {"bi": 0, "angular": 1, "angular_last": 2}  # a criterion's place in PartMeter.means' triples


def block_order(method: str, n_layers: int, *, proxies: dict[Block, tuple[float, float, float]],
                greedy: Sequence[Block], degradation: dict[Block, float]) -> list[Block]:
    """Every attention and MLP block, cheapest to remove first, by one criterion (--unit block):
    each block's own proxy (LLM-Drop), the greedy order, the sublayer map's D%, or from the end."""
    units = units_of(n_layers, True)
    if method == "ppl":
        return list(greedy)
    if method == "last":
        return units[::-1]
    score = degradation if method == "map" else {b: proxies[b][PROXIES[method]] for b in units}
    return sorted(units, key=lambda b: score[b])  # stable: ties in running order


def layers_worth(model, n: int) -> float:
    """The parameters of n layers (n times the mean decoder layer's)."""
    sizes = layer_params(model)
    return n * sum(sizes) / len(sizes)


def block_cuts(model, order: Sequence[Block], counts: Sequence[int]) -> dict[int, tuple[Block, ...]]:
    """Each count n: the first blocks of `order` whose removed parameters reach n layers' worth."""
    chosen = {}
    for n in counts:
        target, taken = layers_worth(model, n), []
        for block in order:
            if removed_params(model, taken) >= target:
                break
            taken.append(block)
        chosen[n] = tuple(sorted(taken, key=lambda b: (b[0], PARTS.index(b[1]))))
    return chosen


def point_cut(point: PruneCut) -> Cut:
    """What a curve's point removed, as `cut_removed` takes it: its blocks, else its layers."""
    return tuple((b.layer, b.part) for b in point.blocks) if point.blocks else tuple(point.layers)


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




def adapter_folder(adapters: tempfile.TemporaryDirectory | None, layers: Sequence[int]) -> Path | None:
    """Where LoRA healing saves the adapter of this cut, when the run exports adapters."""
    return None if adapters is None else Path(adapters.name) / cut_name(layers)


def export_cut(doc: PruneResult, best: tuple[float, PruneCut, CutWeights | None],
               loaded: LoadedModel, settings: PruneSettings,
               adapters: tempfile.TemporaryDirectory | None) -> Iterator[Event]:
    """The chosen cut (healed: its trained layers' weights) saved with its card, the mergekit
    configuration of the cut and, after LoRA healing, the adapter (or only the adapter)."""
    final, point, weights = best
    cut = point_cut(point)
    whole, alone = split_cut(cut) if point.blocks else (cut, ())
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

    def observe(batch, index, layer_input, layer_output):
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

    greedy: list = []
    single: list[float] = []
    if "ppl" in methods:
        target = math.ceil(layers_worth(model, counts[-1])) if blocks else counts[-1]
        greedy, single = yield from greedy_ppl(model, tokenizer, texts, settings, target, cancel,
                                               evaluator.batch_size)
    if blocks:  # each block's proxies, in units_of order
        proxies = part_meter.means()
        scores = {m: np.array([proxies[b][i] for b in units_of(n, True)]) for m, i in PROXIES.items()}
    else:
        scores = {"angular": angular.distances(1) if angular is not None else None, "bi": bi,
                  "angular_last": last_blocks[1]}
    scores |= {"ppl": np.array(single) if single else None, "last": None,
               "map": np.array([degradation[u] for u in units_of(n, blocks)]) if "map" in methods else None}
    for method in methods:
        if scores[method] is not None:
            yield PruneScores(method, [float(v) for v in scores[method]])

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
    measured: dict[tuple, TextScores] = {}
    healed: dict[tuple[int, ...], float] = {}
    replaced: dict[tuple, CutWeights] = {}
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
            key = layers if how is None else (*layers, how)
            if key not in measured and how is not None:
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
                        judge.healed(model, layers)
            if how is not None:
                healed_ppl = None  # ReplaceMe needs no training: its rows are not healed
            whole = split_cut(layers)[0] if blocks else layers
            params = removed_params(model, layers) if blocks else sum(sizes[i] for i in layers)
            if blocks:
                yield Message(f"{label} -{count} layers' worth ({layers_worth(model, count):.0f} parameters): "
                              f"blocks {cut_name(layers)} ({params} parameters)")
            point = PruneCut(method=label, removed=count, layers=list(whole), ppl=ppl, ci_low=low, ci_high=high,
                             healed_ppl=healed_ppl, **(judge.row(key, ppl, baseline) if judge is not None else {}),
                             removed_params=params,
                             **({"blocks": [PrunedBlock(*b) for b in layers]} if blocks else {}))
            if judge is not None:
                yield Message(f"{label} -{count}: accuracy {accuracy_line(point.accuracy)}"
                              + (f"; {point.disagreement}" if point.disagreement else ""),
                              "warning" if point.disagreement else "info")
            curve.append(point)
            yield PrunePoint(label, count, list(whole), ppl, baseline, low, high, healed_ppl)
            yield Progress(m_index * len(counts) + c_index + 1, total, f"prune: {label}")
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
    agreement = {m: spearman(scores[m], scores["ppl"]) for m in methods
                 if m != "ppl" and scores["ppl"] is not None and scores[m] is not None}
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
        scores={m: [float(v) for v in scores[m]] for m in methods if scores[m] is not None},
        depth_fit=depth_fit,
        heal=(PruneHeal(steps=settings.heal_steps, what=settings.heal, train_source=healer.source,
                        train_blocks=len(healer.blocks)) if healer is not None else None),
        exported=exported,
        exported_point=best_export[1] if exported else None,
        seconds=time.perf_counter() - started,
        protocol=evaluator.protocol,
        **(judge.result() if judge is not None else {}),
    )
    if exported is not None:
        yield from export_cut(doc, best_export, loaded, settings, adapters)
    yield Result("prune", json_safe(doc))
