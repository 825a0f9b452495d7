"""`anatomy-tui run dynamics`: hidden-state angles per layer, token PCA and clusters, headless."""

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
    parser.add_argument("--text-file", default=None,
                        help="UTF-8 file, one text per line (default: the built-in held-out corpus)")
    parser.add_argument("--max-tokens", type=int, default=8192, help="tokens to read at most (default 8192)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256, help="tokens per text at most")
    parser.add_argument("--include-first", action="store_true",
                        help="keep each text's first position (the attention sink); excluded by default")
    parser.add_argument("--profile", default="both", choices=["both", "state", "update"],
                        help="what PCA sees per token: both angle profiles (default), or one")
    parser.add_argument("--clusters", type=int, default=0, metavar="K",
                        help="number of clusters; 0 (default) picks k=2..6 by silhouette")
    parser.add_argument("--components", type=int, default=10, help="PCA components kept (default 10)")
    parser.add_argument("--examples", type=int, default=3, help="example tokens per cluster (default 3)")
    parser.add_argument("--logit-lens", action="store_true",
                        help="also the next-token loss of every layer through the final norm and head")
    parser.add_argument("--lens", default="plain", choices=["plain", "last-block"],
                        help="how the lens reads layer l: plain (its output through the final norm and head) "
                             "or last-block (its input through the last block first, as paper B); "
                             "last-block turns the lens on")
    parser.add_argument("--seed", type=int, default=0, help="PCA/KMeans seed")


def main(args: argparse.Namespace) -> int:
    from engine.experiments.dynamics import DynamicsSettings, run_dynamics

    settings = DynamicsSettings(
        text_file=args.text_file, max_tokens=args.max_tokens, batch_size=args.batch_size,
        max_length=args.max_length, include_first=args.include_first, profile=args.profile,
        clusters=args.clusters, components=args.components, examples=args.examples,
        logit_lens=args.logit_lens, seed=args.seed, lens=args.lens,
    )
    session, loaded, spec = prepare_run(args, settings, [(args.text_file, "text file")])
    events = run_dynamics(loaded.model, loaded.tokenizer, settings, model_name=loaded.name)
    result = drive(session, "dynamics", spec, events, args.json)
    if result is not None:
        print_dynamics(result.data)
    return 0


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _spread(q: dict) -> str:
    """'median [q1-q3]', short enough for an 80-column table."""
    return "" if q["median"] is None else f"{q['median']:.1f} [{q['q1']:.0f}-{q['q3']:.0f}]"


def print_dynamics(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    table = Table(title=Text(f"{doc['model']}  {doc['tokens']} tokens, first position {doc['first_token']}  "
                        "(degrees: median [q1-q3])"))
    columns = ["layer", "theta(h, h')", "theta(dh, dh')", "|h'|", "|dh|/|h|", "theta(h', h_L)", "s"]
    lens = doc.get("logit_lens")
    if lens:
        columns.append("lens loss" if lens.get("lens", "plain") == "plain" else "last-block loss")
    for column in columns:
        table.add_column(column, justify="right")
    for row in doc["layers"]:
        cells = [
            str(row["layer"]),
            _spread(row["angle_state"]),
            _spread(row["angle_update"]),
            _cell(row["norm"]["median"]),
            f"{row['relative_update']['median']:.3f}",
            _cell(row["angle_final"]["median"]),
            "" if row["progress"]["median"] is None else f"{row['progress']['median']:.2f}",
        ]
        if lens:
            cells.append(f"{row['lens_loss']:.3f}")
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)
    core = doc["core"]
    console.print(f"core layers {core['layers'][0]}-{core['layers'][1]}: median theta(dh, dh') "
                  f"{_cell(core['angle_update_median'])} deg, "
                  f"theta(h, h') {_cell(core['angle_state_median'])} deg, "
                  f"|dh|/|h| {core['relative_update_median']:.3f}", highlight=False)
    pca = doc["pca"]
    explained = ", ".join(f"{x:.3f}" for x in pca["explained"][:5])
    console.print(f"PCA explained variance: {explained}; k={pca['k']} ({pca['k_choice']}); "
                  f"bulk fraction {pca['bulk_fraction']:.4f} (paper: 0.996)", highlight=False)
    for cluster in pca["clusters"]:
        top = ", ".join(f"{word!r}x{count}" for word, count in cluster["top_tokens"])
        console.print(f"cluster {cluster['label']}{' (bulk)' if cluster['bulk'] else ''}: "
                      f"{cluster['size']} tokens ({cluster['fraction']:.4f}), top: {top}",
                      markup=False, highlight=False)
        for example in cluster["examples"]:
            console.print(f"    {example}", markup=False, highlight=False)
