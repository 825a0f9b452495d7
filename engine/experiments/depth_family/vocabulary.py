"""The depth family's words (paper B on the user's own data): DepthFamilySettings, the
`depth-family.*` events, and results/depth-family.json. Torch-free.

A family is a grid of small decoder LMs of one architecture, one member per (depth, width,
tokens, seed), trained by one recipe on one corpus and scored on one held-out split.

Events, in the order a run sends them:
  `depth-family.plan`    FamilyPlan: every member's parameters, steps and training FLOPs (6 N D),
                         the total, the measured seconds of one step and the time estimate
  `depth-family.step`    MemberStep: one member's training loss (and, every --eval-every steps and
                         at its last, its held-out loss) at a step: the members' live curves
  `depth-family.member`  MemberDone: a member finished: its final held-out loss and anatomy summary
                         (the table that fills in as members finish)
  `depth-family.fit`     FamilyFit: the depth term fitted to the finished family

The result document, DepthFamilyResult:
  recipe           Recipe: the one training recipe, stated in full (optimizer, schedule, batch, ...)
  plan             ComputePlan: as sent before the first step
  members          Member per trained model: `name` (l4-w64-t262144-s0), depth, width, tokens, seed,
                   params (non-embedding N of 6 N D), steps, final train and held-out loss, seconds,
                   `curve` (CurvePoint: step, train loss, held-out loss where evaluated) and
                   `anatomy` (MemberAnatomy, None with --no-anatomy):
                     map              the ablation experiment's rows (AblationRow: the layer's PPL
                                      when it is replaced by its neighbours' mean, degradation %,
                                      class) on the held-out text
                     baseline_ppl     the member's held-out PPL with every layer
                     angle_state      per layer, the median angle (degrees) between its input and
                                      output hidden state (the dynamics experiment's angle_state)
                     angle_update     per consecutive pair, the median angle (degrees) between the
                                      two layers' updates (dynamics' angle_update; one fewer)
                     redundant_share  share of its layers the map classes `redundant`
                     mean_angle       mean of angle_state over its layers
                     neighbour_similarity  mean over consecutive pairs of cos(angle_update): 1 when
                                      neighbouring layers write the same update (None at depth 1)
  csv              the CSV of the final held-out losses, in scaling-fit's format (the columns
                   loss, d_model, n_layers, num_tokens, seed), readable by `run scaling-fit --csv`
  fit              DepthFit: L = c_l / l^a_l + L0 at one width and token budget: a_l, its bootstrap
                   ci95 over members and seeds, c_l, L0, the points fitted, the leave-one-depth-out
                   predictions (LooPoint) and their RMSE, the profile of the objective over a_l
                   (ProfilePoint), `flat_range` (the a_l whose objective is within 0.3 % of the best,
                   paper B's own test), `weakly_identified`, and `references` (paper B's 1.2 ± 0.3
                   and the toy's two regimes, about 1 and about 3) beside it; None where fewer than
                   three depths finished
  full_law         FullLaw: scaling-fit's full law where widths or token budgets vary (None when
                   they do not, `full_law_note` says why)
  anatomy_by_depth AnatomyRow per depth: mean over the seeds (and widths, tokens) of the members'
                   redundant_share, mean_angle and neighbour_similarity, each with a 95 % interval
                   (t over members; None with one member)
  settings, seconds, and `partial` (true: a stopped run's finished members)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.core.codec import ABSENT
from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, event, result
from engine.core.settings import MAX_SEED, MAX_WINDOW, WINDOW_WHY, Settings, setting
from engine.experiments.ablation.vocabulary import AblationRow
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.models.options import TRAIN_DEVICE_HELP, device_setting, dtype_setting

PAPER_B_A_L = (1.2, 0.3)  # paper B's depth exponent and its stated uncertainty
TOY_REGIMES = {"ensemble averaging": 1.0, "smooth dynamics": 3.0}  # the toy's two regimes (toy-depth)
FLAT_WITHIN = 0.003  # the objective within 0.3 % of its best: paper B's "weakly identified" band
SEPARATOR = ","


@dataclass(frozen=True)
class DepthFamilySettings(Settings):
    """Defaults: the CPU run of docs/experiments/depth-family.md (depths 1,2,4,8, width 64, two seeds,
    the package's text, a character tokenizer), a few minutes."""

    depths: tuple[int, ...] = setting((1, 2, 4, 8), "layers of the members (at least three depths)", low=1,
                                      high=256)
    widths: tuple[int, ...] = setting((64,), "hidden sizes of the members (a multiple of --heads)", low=8)
    tokens: tuple[int, ...] = setting((327_680,), "training tokens per member (steps = tokens / (batch x context))",
                                      low=1)
    seeds: tuple[int, ...] = setting((0, 1), "seeds: one member per seed in each cell", low=0, high=MAX_SEED)
    base_model: str | None = setting(None, "take the architecture (config) and tokenizer of this Hugging Face model "
                                "name or folder, its depth and width replaced by the grid's (default: a Llama-"
                                "style decoder and a character tokenizer)", flag="--model")
    corpus: str | None = setting(None, "the text: a local .txt (one text a line), .jsonl, .parquet file or "
                                 "folder, or a Hugging Face dataset NAME[:CONFIG][:SPLIT] (split default train); "
                                 "every tenth text held out (default: the package's text, pydoc topics, every "
                                 "fifth topic held out)")
    text_column: str = setting("text", "the column of --corpus that holds the text")
    context: int = setting(64, "tokens per training and held-out window", low=2, high=MAX_WINDOW, why=WINDOW_WHY)
    batch_size: int = setting(8, "windows per step", low=1)
    heads: int = setting(4, "attention heads", low=1)
    ffn_ratio: float = setting(4.0, "MLP width as a multiple of the hidden size", above=0)
    lr: float = setting(3e-3, "peak AdamW learning rate", above=0)
    warmup_frac: float = setting(0.05, "share of each member's steps warming up linearly, then cosine decay to 0",
                                 low=0, below=1)
    weight_decay: float = setting(0.01, "AdamW weight decay", low=0)
    grad_clip: float = setting(1.0, "gradient norm clip", above=0)
    eval_every: int = setting(50, "held-out loss every N steps (and at each member's last step)", low=1)
    eval_windows: int = setting(64, "held-out windows (the same for every member)", low=1)
    checkpoint_every: int = setting(100, "checkpoint the running member every N steps (0: at its end only)",
                                    low=0, resume_free=True)
    anatomy: bool = setting(True, "map every member (layer ablation) and its angle dynamics on the held-out text")
    anatomy_texts: int = setting(32, "held-out windows the members' maps and angles read", low=1)
    bootstrap: int = setting(1000, "bootstrap resamples of the members for a_l's interval", low=0)
    max_hours: float | None = setting(None, "refuse a plan whose estimate exceeds this many hours", above=0,
                                      none_word="none")
    threads: int = setting(1, "torch CPU threads (one is fastest for these small matrices; 0: torch's default)",
                           low=0, resume_free=True)
    device: str = device_setting(TRAIN_DEVICE_HELP)
    dtype: str = dtype_setting("forward precision; the weights and AdamW stay float32 (mixed precision)")

    def check(self) -> None:
        if len(set(self.depths)) < 3:
            raise UserError(f"--depths needs at least three different depths to fit an exponent (got "
                            f"{SEPARATOR.join(map(str, self.depths))}); e.g. --depths 1,2,4,8")
        if not self.widths or not self.tokens or not self.seeds:
            raise UserError("--widths, --tokens and --seeds need at least one value each")
        for width in self.widths:
            if width % self.heads:
                raise UserError(f"--widths {width} must be a multiple of --heads {self.heads}")

    def members(self) -> list[MemberSpec]:
        """The grid, in training order: smallest compute first, so the fit's points come early."""
        grid = [MemberSpec(depth, width, tokens, seed) for tokens in sorted(set(self.tokens))
                for width in sorted(set(self.widths)) for depth in sorted(set(self.depths))
                for seed in dict.fromkeys(self.seeds)]
        return sorted(grid, key=lambda m: (m.tokens * m.width * m.width * m.depth, m.seed))


@dataclass(frozen=True)
class MemberSpec:
    """One cell of the grid and one seed."""

    depth: int
    width: int
    tokens: int
    seed: int

    @property
    def name(self) -> str:
        return f"l{self.depth}-w{self.width}-t{self.tokens}-s{self.seed}"


@dataclass(frozen=True)
class PlannedMember:
    """One member of the compute plan: N (non-embedding parameters), its steps and 6 N D FLOPs."""

    name: str
    depth: int
    width: int
    tokens: int
    seed: int
    params: int
    steps: int
    flops: float


@dataclass(frozen=True)
class ComputePlan:
    """Before the first step: every member, the total FLOPs, the seconds of one measured step of the
    largest member and the estimate of the whole family (its steps scaled by FLOPs)."""

    members: list[PlannedMember]
    total_flops: float
    measured_step_seconds: float
    measured_member: str
    estimate_hours: float
    device: str


@event("depth-family.plan")
class FamilyPlan(Event):
    """Sent before the first step: the compute plan (members' parameters, steps, 6 N D FLOPs, the
    total and the time estimate from a measured step)."""

    plan: ComputePlan


@event("depth-family.step")
class MemberStep(Event):
    """One member's training loss at a step, its held-out loss where evaluated (else None), and the
    learning rate: a point of the members' live curves."""

    member: str
    depth: int
    width: int
    tokens: int
    seed: int
    step: int
    steps: int
    train_loss: float
    heldout_loss: float | None
    lr: float


@dataclass(frozen=True)
class MemberAnatomy:
    """A trained member's layer map and angle dynamics on the held-out text (module doc)."""

    map: list[AblationRow]
    baseline_ppl: float
    angle_state: list[float | None]
    angle_update: list[float | None]
    redundant_share: float
    mean_angle: float | None
    neighbour_similarity: float | None


@event("depth-family.member")
class MemberDone(Event):
    """A member finished: its final held-out loss, its training seconds and its anatomy summary (a row
    of the members' table)."""

    member: str
    depth: int
    width: int
    tokens: int
    seed: int
    params: int
    heldout_loss: float
    seconds: float
    redundant_share: float | None
    mean_angle: float | None
    neighbour_similarity: float | None
    done: int
    total: int


@dataclass(frozen=True)
class CurvePoint:
    """A point of a member's training curve: held-out loss None where not evaluated."""

    step: int
    train_loss: float
    heldout_loss: float | None


@dataclass(frozen=True)
class Member:
    """One trained member (module doc)."""

    name: str
    depth: int
    width: int
    tokens: int
    seed: int
    params: int
    steps: int
    train_loss: float
    heldout_loss: float
    seconds: float
    curve: list[CurvePoint]
    anatomy: MemberAnatomy | None


@dataclass(frozen=True)
class LooPoint:
    """A depth left out: its measured mean loss, what the fit without it predicts, and the error."""

    depth: int
    measured: float
    predicted: float | None
    error: float | None


@dataclass(frozen=True)
class ProfilePoint:
    """The objective (mean squared residual) with a_l held at this value, c_l and L0 refitted."""

    alpha_l: float
    objective: float


@dataclass(frozen=True)
class Reference:
    """A published or toy value of a_l set beside the measured one; interval None where none was stated."""

    name: str
    alpha_l: float
    interval: list[float] | None


@dataclass(frozen=True)
class DepthFit:
    """L = c_l / l^a_l + L0 fitted to the members of one width and token budget (module doc)."""

    width: int
    tokens: int
    depths: list[int]  # each member fitted, in order
    losses: list[float]
    alpha_l: float
    c_l: float
    L0: float
    ci95: list[float] | None  # a_l's bootstrap interval over members (resampled within each depth)
    bootstrap_valid: int
    loo: list[LooPoint]
    loo_rmse: float | None
    profile: list[ProfilePoint]
    flat_range: list[float]  # a_l whose objective lies within 0.3 % of the best
    weakly_identified: bool
    references: list[Reference]


@dataclass(frozen=True)
class FullLaw:
    """scaling-fit's full law fitted to the family's CSV: its parameters, their intervals, objective."""

    params: dict[str, float | None]
    ci95: dict[str, list[float] | None]
    objective: float | None
    n_points: int


@event("depth-family.fit")
class FamilyFit(Event):
    """The depth term fitted to the finished members: a_l, its interval, c_l, L0, the leave-one-depth-out
    RMSE, and whether the profile says a_l is weakly identified."""

    alpha_l: float
    ci95: list[float] | None
    c_l: float
    L0: float
    loo_rmse: float | None
    weakly_identified: bool


@dataclass(frozen=True)
class AnatomyRow:
    """The members of one depth, their anatomy averaged, each with a 95 % interval over members."""

    depth: int
    members: int
    redundant_share: float | None
    redundant_share_ci: list[float] | None
    mean_angle: float | None
    mean_angle_ci: list[float] | None
    neighbour_similarity: float | None
    neighbour_similarity_ci: list[float] | None


@dataclass(frozen=True)
class Recipe:
    """The one training recipe, stated in full."""

    architecture: str
    tokenizer: str
    vocab_size: int
    corpus: str
    heldout: str
    optimizer: str
    schedule: str
    lr: float
    betas: list[float]
    weight_decay: float
    grad_clip: float
    batch_size: int
    context: int
    heads: int
    ffn_ratio: float
    seeds: str
    precision: str


@result("depth-family")
class DepthFamilyResult(ResultDocument):
    """results/depth-family.json (module doc)."""

    recipe: Recipe
    plan: ComputePlan
    members: list[Member]
    csv: str  # the CSV's path
    fit: DepthFit | None
    full_law: FullLaw | None
    full_law_note: str
    anatomy_by_depth: list[AnatomyRow]
    settings: DepthFamilySettings
    seconds: float
    partial: bool = field(default=ABSENT, kw_only=True)  # true: a stopped run's finished members

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per member: its cell, seed, parameters, final held-out loss and anatomy summary, and the
        family's fitted a_l."""
        alpha = self.fit.alpha_l if self.fit is not None else None
        rows = []
        for m in self.members:
            anatomy = m.anatomy
            rows.append({"depth": m.depth, "width": m.width, "tokens": m.tokens, "seed": m.seed, "params": m.params,
                         "heldout_loss": m.heldout_loss,
                         "redundant_share": anatomy.redundant_share if anatomy else None,
                         "mean_angle": anatomy.mean_angle if anatomy else None,
                         "neighbour_similarity": anatomy.neighbour_similarity if anatomy else None,
                         "alpha_l": alpha})
        return rows


def references() -> list[Reference]:
    """Paper B's a_l and the toy's two regimes, set beside a measured exponent."""
    a, sd = PAPER_B_A_L
    return [Reference("paper B (Chinchilla runs)", a, [a - sd, a + sd]),
            *(Reference(f"toy: {name}", value, None) for name, value in TOY_REGIMES.items())]


def sample() -> DepthFamilyResult:
    """Depths 1, 2, 4, 8, two seeds, losses on 1.5 / l^1.1 + 2.0 with a small wobble, each member's map:
    the tests' and snapshots' example."""
    settings = DepthFamilySettings()
    specs = settings.members()
    classes = ("critical", "important", "minor", "redundant")

    def anatomy(depth: int, seed: int) -> MemberAnatomy:
        rows = [AblationRow(layer=i, ppl=12.0 + 40.0 / (i + 1), degradation_pct=200.0 / (i + 1) / (1 + seed),
                            layer_class=classes[min(3, i)]) for i in range(depth)]  # fmt: skip
        state = [30.0 - 2.0 * i for i in range(depth)]
        update: list[float | None] = [80.0 - 3.0 * i for i in range(depth - 1)]
        similarity = sum(math.cos(math.radians(u or 0.0)) for u in update) / len(update) if update else None
        return MemberAnatomy(map=rows, baseline_ppl=12.0, angle_state=list(state), angle_update=update,
                             redundant_share=sum(r.layer_class == "redundant" for r in rows) / depth,
                             mean_angle=sum(state) / depth, neighbour_similarity=similarity)

    members, planned = [], []
    for spec in specs:
        loss = 2.0 + 1.5 / spec.depth**1.1 * (1.01 if spec.seed else 0.99)
        params = 12 * spec.depth * spec.width**2
        steps = spec.tokens // (settings.batch_size * settings.context)
        curve = [CurvePoint(step=s, train_loss=loss + 2.0 / (1 + s / 20), heldout_loss=loss + 2.1 / (1 + s / 20))
                 for s in (0, steps // 2, steps)]  # fmt: skip
        members.append(Member(name=spec.name, depth=spec.depth, width=spec.width, tokens=spec.tokens, seed=spec.seed,
                              params=params, steps=steps, train_loss=loss - 0.05, heldout_loss=loss,
                              seconds=2.0 * spec.depth, curve=curve, anatomy=anatomy(spec.depth, spec.seed)))
        planned.append(PlannedMember(name=spec.name, depth=spec.depth, width=spec.width, tokens=spec.tokens,
                                     seed=spec.seed, params=params, steps=steps, flops=6.0 * params * spec.tokens))
    plan = ComputePlan(members=planned, total_flops=sum(p.flops for p in planned), measured_step_seconds=0.01,
                       measured_member=planned[-1].name, estimate_hours=0.02, device="cpu")
    depths = [m.depth for m in members]
    fitted = [2.0 + 1.5 / d**1.1 for d in (1, 2, 4, 8)]
    loo = [LooPoint(depth=d, measured=v, predicted=v * 1.01, error=v * 0.01) for d, v in zip((1, 2, 4, 8), fitted,
                                                                                              strict=True)]
    profile = [ProfilePoint(alpha_l=0.5 + 0.1 * i, objective=1e-4 + 1e-3 * (0.5 + 0.1 * i - 1.1) ** 2)
               for i in range(16)]
    fit = DepthFit(width=64, tokens=settings.tokens[0], depths=depths, losses=[m.heldout_loss for m in members],
                   alpha_l=1.1, c_l=1.5, L0=2.0, ci95=[0.9, 1.35], bootstrap_valid=1000, loo=loo, loo_rmse=0.02,
                   profile=profile, flat_range=[1.0, 1.2], weakly_identified=False, references=references())
    by_depth = [AnatomyRow(depth=d, members=2, redundant_share=max(0.0, (d - 3) / d),
                           redundant_share_ci=[0.0, max(0.0, (d - 3) / d) + 0.1], mean_angle=30.0 - d,
                           mean_angle_ci=[28.0 - d, 32.0 - d], neighbour_similarity=None if d == 1 else 0.2 + 0.02 * d,
                           neighbour_similarity_ci=None if d == 1 else [0.1, 0.3 + 0.02 * d])
                for d in (1, 2, 4, 8)]  # fmt: skip
    recipe = Recipe(architecture="LlamaForCausalLM", tokenizer="characters of the corpus", vocab_size=100,
                    corpus="pydoc_data.topics (CPython documentation)", heldout="every fifth topic",
                    optimizer="AdamW", schedule="linear warmup over 5% of each member's steps, cosine decay to 0",
                    lr=settings.lr, betas=[0.9, 0.95], weight_decay=settings.weight_decay,
                    grad_clip=settings.grad_clip, batch_size=settings.batch_size, context=settings.context,
                    heads=settings.heads, ffn_ratio=settings.ffn_ratio, seeds="0,1", precision="float32")
    return DepthFamilyResult(recipe=recipe, plan=plan, members=members, csv="checkpoints/depth-family/family.csv",
                             fit=fit, full_law=None, full_law_note="one width and one token budget: the depth term "
                             "alone", anatomy_by_depth=by_depth, settings=settings, seconds=60.0)


CONTRACT = Contract(
    DepthFamilySettings, DepthFamilyResult, sample,
    frame=Frame(columns=("depth", "width", "tokens", "seed", "params", "heldout_loss", "redundant_share",
                         "mean_angle", "neighbour_similarity", "alpha_l"), rows=8),
    figure=FigureShape(panels=(("depth l (layers)", "held-out loss"), ("training step", "held-out loss"),
                               ("depth l (layers)", "share of redundant layers"),
                               ("depth l (layers)", "mean angle (degrees)"),
                               ("depth l (layers)", "neighbour similarity"))),
)
