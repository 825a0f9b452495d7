"""`anatomy-tui run scaling-fit`: fit L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 to training runs.

Flags default to None and only the given ones replace fields of ScalingFitSettings, so the defaults
live in one place (the engine) and this module imports nothing heavy until main().
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tui.commands.common import add_session_arguments, drive, open_session

# flag -> (settings field, type, help)
_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--loss-col", "loss_column", str, "loss column (default loss)"),
    ("--width-col", "width_column", str, "width column (default d_model)"),
    ("--depth-col", "depth_column", str, "depth column (default n_layers)"),
    ("--tokens-col", "tokens_column", str, "training-tokens column (default num_tokens)"),
    ("--exclude-highest", "exclude_highest", int, "drop the K highest losses (default 40, as the paper)"),
    ("--restarts", "restarts", int, "random restarts of the full fit (default 512)"),
    ("--huber", "huber_delta", float,
     "Huber on log residuals, this threshold (e.g. 1e-3 as Hoffmann et al.); default least squares"),
    ("--bootstrap", "bootstrap", int, "bootstrap resamples for the 95%% intervals (default 200; 0 skips)"),
    ("--bootstrap-restarts", "bootstrap_restarts", int,
     "starts per resample or split: the full-data optimum plus random ones (default 8)"),
    ("--heldout-splits", "heldout_splits", int, "random train/test splits for held-out error (default 20)"),
    ("--heldout-fraction", "heldout_fraction", float, "share of runs held out per split (default 0.2)"),
    ("--seed", "seed", int, "random seed (default 0)"),
    ("--optimizer", "optimizer", str,
     "lm (default): least squares from many starts; paper: paper B's notebook (Adam from its fixed start)"),
    ("--steps", "steps", int, "Adam steps of --optimizer paper (default 50000, as the notebook)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--csv", type=Path, default=None,
                        help="runs as CSV (default ../shared/data/chinchilla/chinchilla_reconstructed.csv)")
    for flag, dest, kind, help_text in _FLAGS:
        parser.add_argument(flag, dest=dest, type=kind, default=None, help=help_text)
    parser.add_argument("--budgets", default=None,
                        help="parameter budgets N for the optimal width/depth table, comma-separated "
                             "(default 1e8,1e9,1e10,1e11)")
    add_session_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from dataclasses import asdict, replace

    from engine.errors import UserError
    from engine.experiments.scaling_fit import (
        ScalingFitSettings,
        check_settings,
        default_csv,
        load_runs,
        run_scaling_fit,
    )

    given = {dest: getattr(args, dest) for _, dest, _, _ in _FLAGS if getattr(args, dest) is not None}
    if args.budgets is not None:
        try:
            given["budgets"] = tuple(float(v) for v in args.budgets.split(",") if v.strip())
        except ValueError as exc:
            raise UserError(f"--budgets takes numbers separated by commas, e.g. 1e9,1e10 ({exc})") from exc
    settings = replace(ScalingFitSettings(), **given)
    check_settings(settings)
    csv_path = args.csv
    if csv_path is None:
        csv_path = default_csv()
        if not csv_path.is_file():
            raise UserError(f"no --csv given and the Chinchilla data is not at {csv_path}; pass --csv FILE")
    runs = load_runs(csv_path, settings)
    spec = {"csv": str(csv_path), **asdict(settings)}
    session = open_session(args, spec)
    result = drive(session, "scaling-fit", spec, run_scaling_fit(runs, settings), args.json)
    if result is None:
        return 1
    params, ci95 = result.data["params"], result.data.get("ci95", {})
    for key in ("alpha_m", "alpha_l", "alpha_D", "L0"):
        interval = f"[{ci95[key][0]:.3f}, {ci95[key][1]:.3f}]" if ci95.get(key) else "n/a"
        print(f"{key:8s} {params[key]:.3f}  95% {interval}")
    profile_ci = result.data.get("alpha_l_profile_ci95")
    if profile_ci:
        low, high = (f"{v:.3f}" if v is not None else "open" for v in profile_ci)
        print(f"alpha_l  profile-likelihood 95% [{low}, {high}]")
    print(f"n_points {result.data['n_points']}  objective {result.data['objective']:.6g} "
          f"(mean squared log residual)  heldout_rmse {result.data.get('heldout_rmse')}")
    return 0
