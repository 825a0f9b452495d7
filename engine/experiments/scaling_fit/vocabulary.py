"""The scaling fit's words: ScalingFitSettings (the CSV and its columns, optimizer, restarts,
bootstrap), the `scaling-fit.stage` event, and results/scaling-fit.json. Numpy- and torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from engine.core.codec import ABSENT
from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, event, result
from engine.core.settings import MAX_SEED, Settings, setting
from engine.experiments.contract import Contract, FigureShape, Frame

CHINCHILLA_RELATIVE = Path("chinchilla") / "chinchilla_reconstructed.csv"


def default_csv() -> Path:
    """The Chinchilla reconstruction shipped in the package (engine/data/chinchilla, its source in
    the README beside it), so the default fit needs no workspace."""
    return Path(str(resources.files("engine").joinpath("data").joinpath(*CHINCHILLA_RELATIVE.parts)))


TERMS = ("m", "l", "D")


OPTIMIZERS = ("lm", "paper")


@dataclass(frozen=True)
class ScalingFitSettings(Settings):
    """Defaults reproduce the paper: the Chinchilla columns, the 40 highest losses dropped."""

    csv: str | None = setting(None, "runs as CSV (default: the Chinchilla reconstruction shipped in the package)",
                              file="CSV file")
    loss_column: str = setting("loss", "loss column", flag="--loss-col")
    width_column: str = setting("d_model", "width column", flag="--width-col")
    depth_column: str = setting("n_layers", "depth column", flag="--depth-col")
    tokens_column: str = setting("num_tokens", "training-tokens column", flag="--tokens-col")
    exclude_highest: int = setting(40, "drop the K highest losses (as the paper)", low=0)
    restarts: int = setting(512, "random restarts of the full fit", low=1)
    huber_delta: float | None = setting(None, "Huber on log residuals with this threshold (e.g. 1e-3 as "
                                        "Hoffmann et al.); 'none': least squares", above=0, flag="--huber",
                                        none_word="none")
    bootstrap: int = setting(200, "bootstrap resamples for the 95% intervals (0 skips)", low=0)
    bootstrap_restarts: int = setting(8, "starts per resample or split: the full-data optimum plus random ones",
                                      low=1)
    heldout_splits: int = setting(20, "random train/test splits for held-out error", low=0)
    heldout_fraction: float = setting(0.2, "share of runs held out per split", above=0, below=1)
    seed: int = setting(0, "random seed", low=0, high=MAX_SEED)
    budgets: tuple[float, ...] = setting((1e8, 1e9, 1e10, 1e11), "parameter budgets N for the optimal "
                                         "width/depth table", above=0)
    optimizer: str = setting("lm", "lm: least squares from many starts (Levenberg-Marquardt); paper: paper B's "
                             "notebook procedure (Adam from its fixed start for --steps steps)",
                             choices=OPTIMIZERS)
    steps: int = setting(50000, "Adam steps of --optimizer paper (the notebook runs 50000)", low=1)
    strict: bool = setting(False, "refuse a CSV with rows that are not usable runs (text, NaN, inf, zero or "
                           "negative values) instead of dropping them with a warning")

    def csv_path(self) -> Path:
        """The CSV to fit: --csv, else the Chinchilla reconstruction."""
        if self.csv is not None:
            return Path(self.csv)
        path = default_csv()
        if not path.is_file():
            raise UserError(f"no --csv given and the Chinchilla data is not at {path} (a damaged install?); "
                            "pass --csv FILE")
        return path

    def check(self) -> None:
        if self.optimizer == "paper" and self.huber_delta is not None:
            raise UserError("--optimizer paper minimises squared log residuals: drop --huber")

    def check_inputs(self) -> None:
        from engine.experiments.scaling_fit.runs import load_runs  # numpy: only once a run is checked

        super().check_inputs()  # a missing, binary or empty file: one line
        load_runs(self.csv_path(), self)


@event("scaling-fit.stage", v1_kind="scaling-fit-stage")
class FitStage(Event):
    """A stage of the fit finished. stage "fit": `values` are the best parameters; stage "bootstrap":
    their bootstrap standard errors."""

    stage: str
    values: dict[str, float]
    seconds: float


@dataclass(frozen=True)
class DepthPoints:
    """results/scaling-fit.json `depth_points`: the runs fitted, each with its depth, its loss and
    `rest`, the fit's width and token terms plus L0 at that run, so loss - rest is the part of the
    loss the depth term c_l / l^a_l has to explain (absent before anatomy-tui 0.3)."""

    depth: list[float]
    loss: list[float]
    rest: list[float]

    def depth_part(self) -> list[tuple[float, float]]:
        """(depth, loss - rest) for every run."""
        return [(d, loss - rest) for d, loss, rest in zip(self.depth, self.loss, self.rest, strict=True)]


@dataclass(frozen=True)
class ProfilePoint:
    """One point of results/scaling-fit.json `profile.alpha_l`: the objective with a_l held here."""

    alpha_l: float
    objective: float | None


@dataclass(frozen=True)
class ScalingProfile:
    """results/scaling-fit.json `profile`: the objective profiled over a_l (None with --huber)."""

    alpha_l: list[ProfilePoint] | None


@dataclass(frozen=True)
class FitRestarts:
    """results/scaling-fit.json `restarts`: how many random restarts reached the best objective."""

    n: int
    reaching_best: int
    best_objective: float | None


@dataclass(frozen=True)
class FitBootstrap:
    """results/scaling-fit.json `bootstrap`: the resamples behind `ci95` and `se`."""

    n: int
    n_valid: int
    restarts: int
    seconds: float


@dataclass(frozen=True)
class PaperFit:
    """results/scaling-fit.json `paper` (--optimizer paper): paper B's Adam procedure, its units,
    coefficients on its log scale, loss and the parameters at snapshots along the way."""

    steps: int
    units: dict[str, float]
    log_c: dict[str, float | None]
    loss: float | None
    trajectory: list[dict[str, float | None]]  # step, alpha_m, alpha_l, alpha_D, L0, objective


@result("scaling-fit")
class ScalingFitResult(ResultDocument):
    """results/scaling-fit.json. The two optimizers write different parts: `lm` the profile,
    bootstrap intervals, restarts and held-out error, `paper` its procedure (`paper`); what a fit
    does not write is ABSENT, and so is what a result of an older version lacks."""

    source: str
    columns: dict[str, str]  # the CSV's column of loss, width, depth and tokens
    n_rows: int
    n_excluded: int
    n_points: int
    optimizer: str = field(default=ABSENT, kw_only=True)  # lm or paper; absent in 0.1
    loss_function: str = field(default=ABSENT, kw_only=True)  # least_squares or huber; absent in 0.1
    huber_delta: float | None
    params: dict[str, float | None]  # alpha_m, alpha_l, alpha_D, c_m, c_l, c_D, L0
    objective: float | None  # mean squared log residual (0.1 wrote the loss function's name here)
    depth_points: DepthPoints | None = field(default=ABSENT, kw_only=True)  # absent before 0.3
    profile: ScalingProfile = field(default=ABSENT, kw_only=True)
    alpha_l_profile_ci95: list[float | None] | None = field(default=ABSENT, kw_only=True)
    ci95: dict[str, list[float] | None] = field(default=ABSENT, kw_only=True)
    se: dict[str, float | None] = field(default=ABSENT, kw_only=True)
    train_rmse: float | None = field(default=ABSENT, kw_only=True)
    train_rmse_log: float | None = field(default=ABSENT, kw_only=True)
    restarts: FitRestarts = field(default=ABSENT, kw_only=True)
    bootstrap: FitBootstrap = field(default=ABSENT, kw_only=True)
    heldout_rmse: float | None = field(default=ABSENT, kw_only=True)
    heldout_rmse_log: float | None = field(default=ABSENT, kw_only=True)
    heldout_splits: int = field(default=ABSENT, kw_only=True)
    heldout_n_test: int = field(default=ABSENT, kw_only=True)
    paper: PaperFit = field(default=ABSENT, kw_only=True)
    optimal_shape: dict[str, Any]  # width and depth that minimise the fit at each budget
    settings: ScalingFitSettings  # as the run resolved them
    seconds: float

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per parameter of the law: its fitted value, 95% interval and standard error (None
        where the fit made none: --optimizer paper, --bootstrap 0)."""
        intervals = {} if self.ci95 is ABSENT else self.ci95
        errors = {} if self.se is ABSENT else self.se
        return [{"param": name, "value": value, "ci_low": (intervals.get(name) or (None, None))[0],
                 "ci_high": (intervals.get(name) or (None, None))[1], "se": errors.get(name)}
                for name, value in self.params.items()]






def sample() -> ScalingFitResult:
    """A fit of eight runs whose depth part lies on 2 / l^0.3 but for a +-2 % wobble, with its
    profile, intervals and restarts: the tests' and snapshots' example."""
    params = {"alpha_m": 0.5, "alpha_l": 0.3, "alpha_D": 0.3, "c_m": 4.0, "c_l": 2.0, "c_D": 50.0, "L0": 1.5}
    profile = [ProfilePoint(alpha_l=0.1 + 0.02 * i, objective=0.01 + (0.1 + 0.02 * i - 0.3) ** 2) for i in range(21)]
    depths = [2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0]
    rest = [1.5 + 0.1 * (i % 3) for i in range(len(depths))]
    loss = [r + params["c_l"] / d ** params["alpha_l"] * (1.02 if i % 2 else 0.98)
            for i, (d, r) in enumerate(zip(depths, rest, strict=True))]
    return ScalingFitResult(
        source="runs.csv", columns={"loss": "loss", "width": "width", "depth": "depth", "tokens": "tokens"},
        n_rows=8, n_excluded=0, n_points=8, optimizer="lm", loss_function="least_squares", huber_delta=None,
        params={**params}, objective=1.25e-4, depth_points=DepthPoints(depth=depths, loss=loss, rest=rest),
        profile=ScalingProfile(alpha_l=profile), alpha_l_profile_ci95=[0.24, 0.37],
        ci95={"alpha_l": [0.22, 0.41], "alpha_m": [0.45, 0.55], "L0": [1.4, 1.6]}, se={}, train_rmse=0.011,
        train_rmse_log=0.01, restarts=FitRestarts(n=64, reaching_best=10, best_objective=1.25e-4),
        bootstrap=FitBootstrap(n=100, n_valid=100, restarts=4, seconds=1.0), heldout_rmse=0.014,
        heldout_rmse_log=0.012, heldout_splits=10, heldout_n_test=2,
        optimal_shape={"width_depth_exponent": None, "note": "an exponent is 0: no interior optimum"},
        settings=ScalingFitSettings(),
        seconds=1.0,
    )  # fmt: skip


CONTRACT = Contract(
    ScalingFitSettings, ScalingFitResult, sample,
    frame=Frame(columns=("param", "value", "ci_low", "ci_high", "se"), rows=7),
    figure=FigureShape(panels=(("depth l (layers)", "loss − other terms"), ("a_l (held)", "objective"))),
)
