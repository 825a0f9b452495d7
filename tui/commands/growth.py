"""`anatomy-tui run growth`: grow a heterogeneous transformer phase by phase from an importance
profile and compare it with a uniform model of the same size at the same token budget."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.errors import UserError
from tui.commands.common import add_session_arguments, check_outputs, drive, open_session

CHECKPOINT_JOB = "growth"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session_arguments(parser)
    parser.add_argument(
        "--preset",
        default="paper",
        choices=["paper", "tiny"],
        help="paper: 9.56M params, 656 steps; tiny: the whole comparison in minutes on a CPU",
    )
    parser.add_argument(
        "--seeds", default=None, help="a count (3 -> seeds 0,1,2) or a list (0,5,7); default 1"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run checkpointed in --session (its saved settings win over flags)",
    )
    profile = parser.add_mutually_exclusive_group()
    profile.add_argument(
        "--profile",
        default=None,
        help="one class per layer, comma-separated: critical,important,minor,redundant,anti",
    )
    profile.add_argument(
        "--profile-from",
        default=None,
        metavar="SESSION",
        help="take the profile from SESSION's results/ablation.json, compressed to --layers",
    )
    parser.add_argument("--layers", type=int, default=12, help="layers for --profile-from (default 12)")
    parser.add_argument(
        "--multipliers",
        default=None,
        help="FFN width multipliers, e.g. critical=4,important=2,minor=2,redundant=1 (default)",
    )
    parser.add_argument(
        "--phases", type=Path, default=None, help="phase table, TOML or JSON (default: paper's)"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="full budget in optimizer steps (paper 656, tiny 400; 0: the --phases lengths)",
    )
    parser.add_argument("--half-fraction", type=float, default=None, help="budget of the growth_50 arm (0.5)")
    parser.add_argument("--arms", default=None, help="comma list of growth_100,growth_50,uniform_100 (all)")
    for flag, kind, text in (
        ("--hidden-size", int, "model width"),
        ("--heads", int, "attention heads"),
        ("--base-ffn", int, "FFN width of a redundant (x1) layer"),
        ("--seq-len", int, "context in characters"),
        ("--batch-size", int, "sequences per step"),
        ("--lr", float, "peak AdamW learning rate"),
        ("--eval-every", int, "validation every N steps"),
        ("--eval-batches", int, "validation batches"),
        ("--checkpoint-every", int, "checkpoint every N steps (and at every phase boundary)"),
        ("--gen-tokens", int, "characters generated per prompt"),
        ("--threads", int, "torch CPU threads (0: default)"),
    ):  # fmt: skip
        parser.add_argument(flag, type=kind, default=None, help=f"{text} (default: the preset's)")
    parser.add_argument(
        "--train-file",
        type=Path,
        default=None,
        help="UTF-8 training text, one paragraph a line, every tenth held out (default: built-in)",
    )


def _seeds(text: str) -> tuple[int, ...]:
    try:
        if "," in text:
            return tuple(int(s) for s in text.split(",") if s.strip())
        count = int(text)
    except ValueError as exc:
        raise UserError(f"--seeds {text!r}: give a count or a comma list of integers") from exc
    if count < 1:
        raise UserError("--seeds must be at least 1")
    return tuple(range(count))


def settings_from_args(args: argparse.Namespace):
    from engine.experiments.growth.experiment import preset_settings
    from engine.experiments.growth.profile import parse_multipliers, parse_profile, profile_from_ablation
    from engine.experiments.growth.protocol import load_phases, validate_phases
    from sessions.store import SessionStore

    changes: dict[str, Any] = {}
    for name in ("steps", "half_fraction", "hidden_size", "heads", "base_ffn", "seq_len", "batch_size", "lr",
                 "eval_every", "eval_batches", "checkpoint_every", "gen_tokens", "threads"):  # fmt: skip
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.seeds is not None:
        changes["seeds"] = _seeds(args.seeds)
    if args.arms is not None:
        changes["arms"] = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if args.profile is not None:
        changes["profile"] = parse_profile(args.profile)
    if args.profile_from is not None:
        doc = SessionStore().open(args.profile_from).load_result("ablation")
        if doc is None:
            raise UserError(
                f"session {args.profile_from!r} has no ablation result; run `anatomy-tui run ablation`"
            )
        changes["profile"] = profile_from_ablation(doc, args.layers)
    if args.multipliers is not None:
        changes["multipliers"] = parse_multipliers(args.multipliers)
    if args.phases is not None:
        changes["phases"] = load_phases(args.phases)
        changes.setdefault("steps", 0)
    if args.train_file is not None:
        changes["train_file"] = str(args.train_file)
    settings = preset_settings(args.preset, **changes)
    if settings.phases is not None:  # fail before a session is made for it
        validate_phases(settings.phases, settings.profile)
    return settings


def main(args: argparse.Namespace) -> int:
    from engine.experiments.growth.experiment import run_growth, saved_settings, settings_to_dict

    if args.resume:
        if args.session is None:
            raise UserError("--resume needs --session NAME: the session whose growth run to continue")
        from sessions.store import SessionStore

        session = SessionStore().open(args.session)
        check_outputs(args, session)
        settings = saved_settings(session.checkpoint_dir(CHECKPOINT_JOB))
        if settings is None:
            raise UserError(
                f"session {args.session!r} has no growth checkpoint to resume; run without --resume"
            )
        print("resuming with the checkpoint's settings (other flags are ignored)", file=sys.stderr)
    else:
        settings = settings_from_args(args)
        session = open_session(args, settings_to_dict(settings))
    checkpoints = session.checkpoint_dir(CHECKPOINT_JOB)
    models = session.path / "growth_models"
    events = run_growth(settings, checkpoint_dir=checkpoints, model_dir=models, resume=args.resume)
    result = drive(
        session, "growth", {**settings_to_dict(settings), "resume": args.resume}, events, args.json
    )
    if result is None:
        print(
            f"stopped; continue with: anatomy-tui run growth --session {session.name} --resume",
            file=sys.stderr,
        )
        return 1
    show(result.data)
    return 0


def show(doc: dict[str, Any]) -> None:
    """The comparison, the budget table and the generations side by side."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    params = doc["params"]
    console.print(
        f"parameters: growth {params['growth']:,}  uniform {params['uniform']:,} "
        f"({100 * (params['uniform'] / params['growth'] - 1):+.3f} %)", highlight=False,
    )  # fmt: skip
    arms = Table(title=f"growth vs uniform, preset {doc['preset']}")
    for column in ("arm", "steps", "val loss mean", "sd", "seeds", "train s", "tokens/s"):
        arms.add_column(column, justify="right" if column != "arm" else "left")
    for name, arm in doc["arms"].items():
        arms.add_row(
            name, str(arm["steps"]), f"{arm['mean']:.4f}", f"{arm['sd']:.4f}", str(len(arm["val_loss"])),
            f"{arm['seconds']:.1f}", f"{arm['tokens_per_s']:,.0f}",
        )  # fmt: skip
    console.print(arms)
    budget = Table(title="effective steps (epochs) per layer")
    budget.add_column("layer")
    budget.add_column("class")
    for name in doc["arms"]:
        budget.add_column(name, justify="right")
    for row in doc["budget_table"]:
        cells = [f"{row['steps'][a]} ({row['epochs'][a]:.2f})" for a in doc["arms"]]
        budget.add_row(str(row["layer"]), row["layer_class"], *cells)
    console.print(budget)
    gens = Table(title="greedy generations", show_lines=True)
    gens.add_column("prompt")
    for name in doc["arms"]:
        gens.add_column(name)
    for row in doc["generations"]:
        gens.add_row(row["prompt"], *(repr(row[a])[1:-1] for a in doc["arms"]))
    console.print(gens)
    ratio = doc.get("ratio_uniform_over_growth_seconds")
    if ratio is not None:
        g, u = doc["arms"]["growth_100"]["mean"], doc["arms"]["uniform_100"]["mean"]
        console.print(
            f"growth_100 vs uniform_100: val loss {g:.4f} vs {u:.4f} ({u / g:.2f}x), uniform/growth seconds "
            f"{ratio:.2f}; the paper: 0.127 vs 0.599 (4.7x), 59.6 s / 52.0 s = 1.15", highlight=False,
        )  # fmt: skip
