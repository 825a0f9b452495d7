"""`anatomy-tui run manipulate`: the five manipulation strategies on chosen layers, headless."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace

from tui.commands.common import (
    add_model_arguments,
    add_session_arguments,
    comma_list,
    drive,
    prepare_run,
)

STRATEGIES = ("zero", "clone", "blend", "svd", "scale")  # engine.experiments.manipulate.STRATEGIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_session_arguments(parser)
    parser.add_argument("--layers", default=None,
                        help="comma list of layers, or 'all'; default: the redundant and anti layers of the "
                             "session's ablation map, else all")
    parser.add_argument("--strategies", type=comma_list(str, "--strategies"), default=STRATEGIES,
                        help=f"comma list from {','.join(STRATEGIES)} (default all five)")
    parser.add_argument("--alphas", type=comma_list(float, "--alphas"),
                        default=(0.0, 0.1, 0.3, 0.5, 0.7, 0.9),
                        help="scale factors for 'scale' (default 0,0.1,0.3,0.5,0.7,0.9)")
    parser.add_argument("--rank", type=int, default=8,
                        help="svd: rank kept of the layer's own difference from the blend (default 8)")
    parser.add_argument("--together", action="store_true",
                        help="also apply each strategy to all chosen layers at once")
    parser.add_argument("--prompt", default="The capital of France is", help="prompt of the greedy samples")
    parser.add_argument("--sample-tokens", type=int, default=20, help="tokens per greedy sample (0: none)")
    parser.add_argument("--eval-set", default="full", choices=["full", "paper"],
                        help="built-in texts: full (48 sentences) or paper (10)")
    parser.add_argument("--eval-file", default=None, help="UTF-8 file, one evaluation text per line")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256, help="tokens per text at most")


def default_layers(session, model_name: str) -> tuple[tuple[int, ...], str]:
    """The redundant and anti layers of the session's ablation map of this model, else () for all."""
    doc = session.load_result("ablation")
    if doc is None or doc.get("model") != model_name:
        return (), "no ablation map of this model in the session: every layer"
    chosen = tuple(row["layer"] for row in doc["layers"] if row["layer_class"] == "redundant" or row["anti"])
    if not chosen:
        return (), "the ablation map has no redundant or anti layers: every layer"
    return chosen, f"redundant and anti layers of the session's ablation map: {','.join(map(str, chosen))}"


def main(args: argparse.Namespace) -> int:
    from engine.experiments.manipulate import ManipulationSettings, run_manipulation

    explicit = None if args.layers in (None, "all") else comma_list(int, "--layers")(args.layers)
    settings = ManipulationSettings(
        layers=explicit or (), strategies=args.strategies, alphas=args.alphas, rank=args.rank,
        together=args.together, prompt=args.prompt, sample_tokens=args.sample_tokens, eval_set=args.eval_set,
        eval_file=args.eval_file, batch_size=args.batch_size, max_length=args.max_length,
    )
    session, loaded, spec = prepare_run(args, settings, [(args.eval_file, "evaluation file")])
    if args.layers is None:
        chosen, why = default_layers(session, loaded.name)
        print(f"layers: {why}", file=sys.stderr)
        settings = replace(settings, layers=chosen)
        spec = {**asdict(settings), "model": loaded.describe()}
    events = run_manipulation(loaded.model, loaded.tokenizer, settings, model_name=loaded.name)
    result = drive(session, "manipulate", spec, events, args.json)
    if result is not None:
        print_report(result.data)
    return 0


def print_report(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"{doc['model']}  baseline PPL {doc['baseline_ppl']:.2f}  prompt {doc['prompt']!r}")
    for column in ("layers", "strategy", "param", "PPL", "D %", "sample"):
        table.add_column(column, justify="right" if column in ("PPL", "D %") else "left")
    for row in doc["results"]:
        layers = row["layers"]
        label = ",".join(map(str, layers)) if len(layers) <= 6 else f"{len(layers)} together"
        ppl = "inf" if row["ppl"] is None else f"{row['ppl']:.2f}"
        d = "inf" if row["degradation_pct"] is None else f"{row['degradation_pct']:.1f}"
        param = "" if row["param"] is None else f"{row['param']:g}"
        table.add_row(label, row["strategy"], param, ppl, d, row["sample"].replace("\n", " ")[:60])
    console.print(table)
    console.print(f"baseline sample: {doc['baseline_sample']!r}", highlight=False)
