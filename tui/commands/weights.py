"""`anatomy-tui run weights`: weight predictability, delta correlation and their nulls, and the
R²-perplexity paradox, headless."""

from __future__ import annotations

import argparse

from tui.commands.common import (
    add_model_arguments,
    add_session_arguments,
    comma_list,
    drive,
    prepare_run,
)


def _counts(text: str) -> tuple[int, ...]:
    """'1,3,9,all' -> (1, 3, 9, 0); 0 stands for every predicted layer."""
    return comma_list(int, "--paradox-counts")(text.replace("all", "0"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_session_arguments(parser)
    parser.add_argument("--components", type=comma_list(str, "--components"), default=(),
                        help="canonical matrix names (Llama: q,k,v,o,gate,up,down); default: all")
    parser.add_argument("--degree", type=int, default=3,
                        help="polynomial degree of the index features (default 3)")
    parser.add_argument("--frequencies", type=comma_list(float, "--frequencies"), default=(1.0, 2.0),
                        help="sin/cos features with these cycles over the depth (default 1,2)")
    parser.add_argument("--alpha", type=float, default=1.0, help="ridge penalty (default 1.0)")
    parser.add_argument("--first-layer", type=int, default=2,
                        help="predict layers from this one to the last (paper: 2)")
    parser.add_argument("--null-draws", type=int, default=5,
                        help="shuffled orders and independent Gaussian draws per null (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the nulls")
    parser.add_argument("--no-paradox", action="store_true",
                        help="skip the perplexity runs with predicted weights")
    parser.add_argument("--paradox-counts", type=_counts, default=(1, 3, 9, 0),
                        help="how many layers to replace in each run (default 1,3,9,all)")
    parser.add_argument("--paradox-layers", type=comma_list(int, "--paradox-layers"), default=(),
                        help="replacement order (the first N are replaced); default best-predicted first")
    parser.add_argument("--paradox-prediction", default="in_sample", choices=["in_sample", "loo"],
                        help="in_sample: the fit that saw the layer (paper); loo: the fit that did not")
    parser.add_argument("--eval-set", default="full", choices=["full", "paper"],
                        help="built-in texts for the paradox: full (48 sentences) or paper (10)")
    parser.add_argument("--eval-file", default=None, help="UTF-8 file, one evaluation text per line")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256, help="tokens per text at most")


def main(args: argparse.Namespace) -> int:
    from engine.experiments.weights import WeightsSettings, run_weights

    settings = WeightsSettings(
        components=args.components, degree=args.degree, frequencies=args.frequencies, alpha=args.alpha,
        first_layer=args.first_layer, null_draws=args.null_draws, seed=args.seed, paradox=not args.no_paradox,
        paradox_counts=args.paradox_counts, paradox_layers=args.paradox_layers,
        paradox_prediction=args.paradox_prediction, eval_set=args.eval_set, eval_file=args.eval_file,
        batch_size=args.batch_size, max_length=args.max_length,
    )
    session, loaded, spec = prepare_run(args, settings, [(args.eval_file, "evaluation file")])
    events = run_weights(loaded.model, loaded.tokenizer, settings, model_name=loaded.name)
    result = drive(session, "weights", spec, events, args.json)
    if result is not None:
        print_report(result.data)
    return 0


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def print_report(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    first, last = doc["predicted_layers"]
    table = Table(title=f"{doc['model']}: predictability of layers {first}-{last} "
                        f"(real / shuffled order / independent layers)")
    for column in ("component", "R² in-sample", "R² leave-one-out", "cos LOO", "delta corr mean", "delta sd",
                   "R² in / LOO, all layers"):
        table.add_column(column, justify="right")
    for name, comp in doc["components"].items():
        shuffled, independent = comp["null_shuffled"], comp["null_independent"]

        def cell(key: str, comp=comp, shuffled=shuffled, independent=independent) -> str:
            return f"{_fmt(comp[key])} / {_fmt(shuffled[key])} / {_fmt(independent[key])}"

        every = comp["all_layers"]
        table.add_row(name, cell("r2_in_sample"), cell("r2_loo"), cell("cosine_loo"), cell("delta_corr_mean"),
                      cell("delta_corr_sd"), f"{_fmt(every['r2_in_sample'])} / {_fmt(every['r2_loo'])}")
    console.print(table)
    for name, comp in doc["components"].items():
        console.print(f"{name}: delta correlation {comp['reading']['delta_corr_mean']}; "
                      f"leave-one-out R² {comp['reading']['r2_loo']}", highlight=False)
    if doc["paradox"]:
        table = Table(title=f"R²-perplexity paradox (baseline PPL {doc['baseline_ppl']:.2f}, "
                            f"{doc['paradox'][0]['prediction']} predictions)")
        for column in ("layers replaced", "PPL", "D %", "mean R² in-sample", "mean R² LOO", "mean cos"):
            table.add_column(column, justify="right")
        for row in doc["paradox"]:
            layers = row["layers_replaced"]
            label = ",".join(map(str, layers)) if len(layers) <= 9 else f"{len(layers)} layers"
            ppl = "inf" if row["ppl"] is None else f"{row['ppl']:.2f}"
            d = "inf" if row["degradation_pct"] is None else f"{row['degradation_pct']:.1f}"
            table.add_row(label, ppl, d, _fmt(row["r2_in_sample_mean"]), _fmt(row["r2_loo_mean"]),
                          _fmt(row["cosine_mean"]))
        console.print(table)
