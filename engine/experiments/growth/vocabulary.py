"""Growth's words: GrowthSettings and its presets (phase tables, widths, seeds), the `growth.*`
events of each arm and phase, and results/growth.json (GrowthResult). Torch-free."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.codec import ABSENT
from engine.core.errors import UserError
from engine.core.events import (
    Event,
    ResultDocument,
    event,
    renamed_v1,
    result,
)
from engine.core.settings import MAX_SEED, MAX_WINDOW, WINDOW_WHY, Settings, setting
from engine.core.untrusted import loads
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.experiments.growth.profile import (
    ANTI,
    CLASSES,
    DEFAULT_MULTIPLIERS,
    PAPER_PROFILE,
    check_profile,
    multipliers_dict,
    parse_multipliers,
)
from engine.experiments.growth.protocol import (
    Phase,
    load_phases,
    phase_from_dict,
    phase_to_dict,
    validate_phases,
)
from engine.models.options import TRAIN_DEVICE_HELP, device_setting, dtype_setting

ARMS = ("growth_100", "growth_50", "uniform_100")


MAX_SEED_COUNT = 1000  # seeds of one run: each trains every arm, so even 1000 is days of compute


def _seeds_text(text: str) -> tuple[int, ...]:
    """'3' -> seeds 0, 1, 2; '0,5,7' (or '4,' for the one seed 4) -> those seeds."""
    if "," in text:
        return tuple(int(part) for part in text.split(",") if part.strip())
    count = int(text)
    if not 1 <= count <= MAX_SEED_COUNT:
        raise ValueError(f"a seed count must be between 1 and {MAX_SEED_COUNT} (each seed trains every arm once)")
    return tuple(range(count))


def _seeds_show(seeds: tuple[int, ...]) -> str:
    if seeds and seeds == tuple(range(len(seeds))):
        return str(len(seeds))
    return ",".join(map(str, seeds)) + ("," if len(seeds) == 1 else "")


def _phases_text(text: str) -> tuple[Phase, ...]:
    """A phase table file (TOML or JSON), or the table itself as JSON (how a job's command says it)."""
    if text.lstrip().startswith(("[", "{")):
        return _phases_decode(loads(text))  # too deep or not JSON: a ValueError, the flag's one line
    return load_phases(Path(text))


def _phases_decode(doc: Any) -> tuple[Phase, ...]:
    rows = doc.get("phases") if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        raise ValueError("a phase table is a list of phases")
    return tuple(row if isinstance(row, Phase) else phase_from_dict(row, n) for n, row in enumerate(rows))


def _multipliers_decode(doc: Any) -> tuple[tuple[str, float], ...]:
    pairs = doc.items() if isinstance(doc, dict) else doc
    return tuple((str(name), float(value)) for name, value in pairs)



@dataclass(frozen=True)
class GrowthSettings(Settings):
    """Every number of a growth run; the defaults are the paper preset (module doc)."""

    preset: str = setting("paper", "the preset these settings started from", cli=False)
    profile: tuple[str, ...] = setting(PAPER_PROFILE, "one class per layer", choices=(*CLASSES, ANTI))
    profile_from: str | None = setting(None, "take the profile from this session's results/ablation.json, "
                                       "compressed to --layers layers (instead of --profile)")
    profile_layers: int = setting(12, "layers for --profile-from", low=1, flag="--layers")
    multipliers: tuple[tuple[str, float], ...] = setting(
        DEFAULT_MULTIPLIERS, "FFN width multipliers, e.g. critical=4,important=2,minor=2,redundant=1",
        parse=parse_multipliers, show=lambda pairs: ",".join(f"{c}={v!r}" for c, v in pairs),
        decode=_multipliers_decode,
    )
    phases: tuple[Phase, ...] | None = setting(
        None, "phase table, TOML or JSON file (default: the paper's six phases, derived from the profile)",
        parse=_phases_text, show=lambda phases: json.dumps([phase_to_dict(p) for p in phases]),
        encode=lambda phases: [phase_to_dict(p) for p in phases], decode=_phases_decode,
    )  # None: derived from the profile
    steps: int = setting(656, "full budget in optimizer steps (paper 656, tiny 400; 0: the phase table's own "
                         "lengths, the default with --phases)", low=0)
    half_fraction: float = setting(0.5, "budget of the growth_50 arm, as a share of the full one", above=0, high=1)
    hidden_size: int = setting(256, "model width", low=1)
    heads: int = setting(8, "attention heads", low=1)
    base_ffn: int = setting(345, "FFN width of a redundant (x1) layer", low=1)
    seq_len: int = setting(128, "context in characters", low=2, high=MAX_WINDOW, why=WINDOW_WHY)
    batch_size: int = setting(32, "sequences per step", low=1)
    lr: float = setting(2e-3, "peak AdamW learning rate", above=0)
    warmup_frac: float = setting(0.05, "share of the steps spent warming up the learning rate", low=0, high=1)
    weight_decay: float = setting(0.01, "AdamW weight decay", low=0)
    grad_clip: float = setting(1.0, "gradient norm clip", above=0)
    eval_every: int = setting(50, "validation every N steps", low=1)
    eval_batches: int = setting(8, "validation batches", low=1)
    checkpoint_every: int = setting(100, "checkpoint every N steps (and at every phase boundary)", low=0)
    seeds: tuple[int, ...] = setting((0,), "a count (3: seeds 0,1,2) or a list (0,5,7)", low=0,
                                     high=MAX_SEED,
                                     parse=_seeds_text, show=_seeds_show)
    arms: tuple[str, ...] = setting(ARMS, "arms to train", choices=ARMS)
    gen_tokens: int = setting(80, "characters generated per prompt", low=0)
    train_file: str | None = setting(None, "UTF-8 training text, one paragraph a line, every tenth held out "
                                     "(default: built-in)", file="training file")
    threads: int = setting(0, "torch CPU threads (0: torch's default)", low=0)
    device: str = device_setting(TRAIN_DEVICE_HELP)
    dtype: str = dtype_setting("forward precision; the weights and AdamW stay float32 (mixed precision)")

    def check(self) -> None:
        check_profile(self.profile)
        multipliers_dict(self.multipliers)
        if not self.seeds or not self.arms:
            raise UserError("--seeds and --arms need at least one value each")
        if self.hidden_size % self.heads:
            raise UserError(f"--hidden-size {self.hidden_size} must be a multiple of --heads {self.heads}")
        if self.phases is not None and self.profile_from is None:
            validate_phases(self.phases, self.profile)

    def override(self, changes: Mapping[str, Any]) -> GrowthSettings:
        """A phase table given without --steps runs at its own lengths."""
        if "phases" in changes and "steps" not in changes:
            changes = {**changes, "steps": 0}
        return super().override(changes)

    def inputs_from(self) -> str | None:
        return self.profile_from


PRESETS: dict[str, GrowthSettings] = {
    "paper": GrowthSettings(),
    "tiny": GrowthSettings(
        preset="tiny", hidden_size=64, heads=4, base_ffn=64, seq_len=128, batch_size=8, steps=400, lr=3e-3,
        eval_every=50, eval_batches=4, checkpoint_every=100, gen_tokens=60, threads=1,
    ),
}  # fmt: skip


@event("growth.plan")
class GrowthPlan(Event):
    """Sent first: every arm's phases (name, start step, steps, layers, clones) and the model sizes,
    so the whole timeline can be drawn before training starts."""

    arms: dict[str, Any]
    seeds: list[int]
    params: dict[str, int]
    profile: list[str]
    batch_tokens: int


@event("growth.phase", v1_fields={"index": "phase_index"})
class GrowthPhase(Event):
    """A phase begins: `added` lists the layers that joined, each with its clone source and FFN scale."""

    arm: str
    seed: int
    phase: str
    phase_index: int
    start_step: int
    steps: int
    layers: list[int]
    added: list[dict[str, Any]]


@event("growth.step")
class GrowthStep(Event):
    """One optimizer step: training loss on its batch, learning rate, and the throughput of the steps
    reported with it (timed together, sent together at an evaluation, a checkpoint or a phase end)."""

    arm: str
    seed: int
    phase: str
    step: int
    total_steps: int
    train_loss: float
    tokens_per_s: float
    lr: float
    n_layers: int


@event("growth.eval")
class GrowthEval(Event):
    """Validation loss (mean cross-entropy per token, nats) after `step`."""

    arm: str
    seed: int
    phase: str
    step: int
    val_loss: float


@event("growth.phase_end", v1_fields={"index": "phase_index"})
class GrowthPhaseEnd(Event):
    """A phase finished: its training seconds and tokens per second (evaluation excluded)."""

    arm: str
    seed: int
    phase: str
    phase_index: int
    steps: int
    seconds: float
    tokens_per_s: float


@event("growth.arm_done")
class GrowthArmDone(Event):
    """An arm finished for one seed: final validation loss, training seconds, tokens per second."""

    arm: str
    seed: int
    val_loss: float
    seconds: float
    tokens_per_s: float
    steps: int


@dataclass(frozen=True)
class GrowthArm:
    """One arm of results/growth.json: losses per seed and their spread, time and throughput."""

    val_loss: list[float]
    mean: float
    sd: float
    seconds: float
    seconds_sd: float
    tokens_per_s: float
    tokens_per_s_sd: float
    steps: int
    tokens: int
    phases: list[dict[str, Any]]
    model: str | None
    curve: list[tuple[int, float]] = field(default=ABSENT, kw_only=True)  # (step, mean val loss); absent before 0.4


@dataclass(frozen=True)
class GrowthBudgetRow:
    """One layer of results/growth.json `budget_table`: the effective steps and epochs it trains
    in each arm (arm name -> number)."""

    layer: int
    layer_class: str
    steps: dict[str, int]
    epochs: dict[str, float]


@dataclass(frozen=True)
class GrowthWidths:
    """results/growth.json `widths`: the growth arm's FFN width per layer, the uniform arm's one width."""

    growth: list[int] | None
    uniform: int | None


@dataclass(frozen=True)
class GrowthData:
    """results/growth.json `data`: the character-level corpus the arms trained on."""

    source: str
    tokenizer: str
    vocab_size: int
    train_tokens: int
    val_tokens: int
    batch_tokens: int


@result("growth")
class GrowthResult(ResultDocument):
    """results/growth.json."""

    preset: str
    params: dict[str, int]  # growth and uniform: parameters of each arm's full model
    arms: dict[str, GrowthArm]
    phases: list[dict[str, Any]]  # the growth arm's phases: the phase table's entry, start, seconds, tokens/s
    generations: list[dict[str, str]]  # per prompt: "prompt" and each arm's greedy text
    budget_table: list[GrowthBudgetRow]
    ratio_uniform_over_growth_seconds: float | None
    profile: list[str]
    widths: GrowthWidths
    data: GrowthData
    settings: GrowthSettings  # as the run resolved them
    paper: dict[str, float]

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per arm and seed: its final validation loss, and the arm's steps, tokens, training
        seconds and throughput (means over its seeds)."""
        return [{"arm": name, "seed": seed, "val_loss": loss, "steps": arm.steps, "tokens": arm.tokens,
                 "seconds": arm.seconds, "tokens_per_s": arm.tokens_per_s}
                for name, arm in self.arms.items()
                for seed, loss in zip(self.settings.seeds, arm.val_loss, strict=False)]

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("budget_table"), list):
            doc["budget_table"] = [renamed_v1(row) for row in doc["budget_table"]]
        return doc














def sample() -> GrowthResult:
    """Growth against uniform on six layers, one seed, no model saved: the tests' and snapshots' example."""
    def phase(name: str, start: int, steps: int, layers: list[int]) -> dict[str, Any]:
        return {"name": name, "start": start, "steps": steps, "layers": layers, "clone_from": {}, "ffn_scale": 1.0}

    phases = {"growth_100": [phase("core", 0, 10, [0, 5]), phase("minor", 10, 10, [0, 1, 2, 5]),
                             phase("full", 20, 10, [0, 1, 2, 3, 4, 5])],
              "uniform_100": [phase("uniform", 0, 30, [0, 1, 2, 3, 4, 5])]}  # fmt: skip
    arms = {
        name: GrowthArm(val_loss=[loss], mean=loss, sd=0.0, seconds=seconds, seconds_sd=0.0, tokens_per_s=1000.0,
                        tokens_per_s_sd=0.0, steps=30, tokens=30 * 64,
                        phases=[{"name": p["name"], "steps": p["steps"], "seconds": 1.0, "tokens_per_s": 1000.0}
                                for p in phases[name]], model=None,
                        curve=[(10, loss + 1.0), (20, loss + 0.4), (30, loss)])
        for name, loss, seconds in (("growth_100", 1.2, 3.0), ("uniform_100", 1.5, 3.5))
    }  # fmt: skip
    steps = {0: 30, 1: 20, 2: 20, 3: 10, 4: 10, 5: 30}
    classes = ("critical", "important", "minor", "redundant", "redundant", "critical")
    budget = [GrowthBudgetRow(layer=layer, layer_class=name, steps={"growth_100": steps[layer], "uniform_100": 30},
                              epochs={"growth_100": steps[layer] / 60, "uniform_100": 0.5})
              for layer, name in enumerate(classes)]  # fmt: skip
    return GrowthResult(
        preset="tiny", params={"growth": 1000, "uniform": 1004}, arms=arms,
        phases=[{**p, "seconds": 1.0, "tokens_per_s": 1000.0} for p in phases["growth_100"]],
        generations=[{"prompt": "The", "growth_100": " cat", "uniform_100": " the"}], budget_table=budget,
        ratio_uniform_over_growth_seconds=3.5 / 3.0, profile=["C", "I", "M", "R", "A", "C"],
        widths=GrowthWidths(growth=[64, 48, 32, 16, 16, 64], uniform=40),
        data=GrowthData(source="built-in", tokenizer="character", vocab_size=96, train_tokens=9000, val_tokens=1000,
                        batch_tokens=64),
        settings=PRESETS["tiny"], paper={"growth_val_loss": 0.127},
    )  # fmt: skip


CONTRACT = Contract(
    GrowthSettings, GrowthResult, sample, presets=PRESETS,
    frame=Frame(columns=("arm", "seed", "val_loss", "steps", "tokens", "seconds", "tokens_per_s"), rows=2),
    figure=FigureShape(panels=(("", "layer"), ("optimizer step", "layer"), ("optimizer step", "validation loss"))),
)
