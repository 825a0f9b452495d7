"""`anatomy-tui run ablation`: the layer-importance map, headless."""

from __future__ import annotations

import argparse

from tui.commands.common import (
    add_model_arguments,
    add_session_arguments,
    drive,
    prepare_run,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_session_arguments(parser)
    parser.add_argument("--method", default="mean", choices=["mean", "skip", "zero"],
                        help="mean: neighbours' mean (paper); skip: pass input through; zero: zero matrices")
    parser.add_argument("--eval-set", default="full", choices=["full", "paper"],
                        help="built-in texts: full (48 sentences) or paper (a 10-sentence subset)")
    parser.add_argument("--eval-file", default=None, help="UTF-8 file, one evaluation text per line")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="N",
                        help="resample the texts N times for 95%% intervals of D (e.g. 1000)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256, help="tokens per text at most")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")


def main(args: argparse.Namespace) -> int:
    from engine.experiments.ablation import AblationSettings, run_ablation

    settings = AblationSettings(
        method=args.method, eval_set=args.eval_set, eval_file=args.eval_file, bootstrap=args.bootstrap,
        batch_size=args.batch_size, max_length=args.max_length, seed=args.seed,
    )
    session, loaded, spec = prepare_run(args, settings, [(args.eval_file, "evaluation file")])
    events = run_ablation(loaded.model, loaded.tokenizer, settings, model_name=loaded.name)
    result = drive(session, "ablation", spec, events, args.json)
    if result is not None:
        print_map(result.data)
    return 0


def print_map(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{doc['model']}  baseline PPL {doc['baseline_ppl']:.2f}  ({doc['method']})")
    for column in ("layer", "PPL", "D %", "95% CI", "class", "BI", "ang"):
        table.add_column(column, justify="right")
    for row in doc["layers"]:
        ci = "" if row["ci_low"] is None else f"[{row['ci_low']:.1f}, {row['ci_high']:.1f}]"
        label = row["layer_class"] + (" anti" if row["anti"] else " anti?" if row["anti_within_noise"] else "")
        table.add_row(str(row["layer"]), f"{row['ppl']:.2f}", f"{row['degradation_pct']:.1f}", ci, label,
                      f"{row['block_influence']:.3f}", f"{row['angular_distance']:.3f}")
    Console().print(table)
    rho = doc["spearman"]
    print(f"Spearman vs D: block influence {rho['block_influence']}, angular distance {rho['angular_distance']}")
