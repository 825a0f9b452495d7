"""`anatomy-tui run recovery`: inject noise into layers, fine-tune each alone, follow its recovery.

Every finished layer is written to the session (checkpoints/recovery/layers.json, atomically), so
a sweep that is killed or cancelled resumes at the next unfinished layer with `--resume`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from typing import Any

from engine.errors import UserError
from engine.events import Event
from sessions.store import Session
from tui.commands.common import (
    add_model_arguments,
    add_session_arguments,
    add_text_arguments,
    drive,
    prepare_run,
)

CHECKPOINT_JOB = "recovery"
CHECKPOINT_FILE = "layers.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_session_arguments(parser)
    add_text_arguments(parser)
    parser.add_argument("--layers", default="11,14,17",
                        help="comma-separated layer indices, or 'all' (default 11,14,17)")
    parser.add_argument("--sigma", type=float, default=0.5,
                        help="noise = sigma * std(W) per matrix (default 0.5)")
    parser.add_argument("--steps", type=int, default=200, help="fine-tuning steps per layer (default 200)")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    parser.add_argument("--batch-size", type=int, default=4, help="training blocks per step (default 4)")
    parser.add_argument("--block-size", type=int, default=128, help="tokens per training block (default 128)")
    parser.add_argument("--train-blocks", type=int, default=128,
                        help="training pool size in blocks, cycled in a seeded order (default 128)")
    parser.add_argument("--eval-every", type=int, default=1, help="evaluate every N steps (default 1)")
    parser.add_argument("--repeats", type=int, default=1, help="noise seeds per layer (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed for noise and batch order (default 0)")
    parser.add_argument("--eval-set", default="full", choices=["full", "paper"],
                        help="built-in evaluation texts: full (48 sentences) or paper (10)")
    parser.add_argument("--eval-batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256, help="tokens per evaluation text at most")
    parser.add_argument("--resume", action="store_true",
                        help="skip layers this session already finished with the same settings")


def parse_layers(text: str) -> tuple[int, ...] | None:
    """'11,14,17' -> (11, 14, 17); 'all' -> None."""
    if text.strip().lower() == "all":
        return None
    try:
        layers = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise UserError(f"--layers {text!r}: give layer numbers like 11,14,17, or 'all'") from exc
    if not layers:
        raise UserError("--layers needs at least one layer number, or 'all'")
    return layers


def checkpoint_path(session: Session):
    return session.checkpoint_dir(CHECKPOINT_JOB) / CHECKPOINT_FILE


def load_finished(session: Session, settings, model_name: str, dtype: str | None = None) -> dict[str, Any]:
    """The finished layers saved by an earlier sweep of this session, checked against `settings`."""
    import json

    path = checkpoint_path(session)
    if not path.exists():
        raise UserError(f"session {session.name} has no recovery sweep to resume; run without --resume")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is damaged ({exc}); run without --resume to start over") from exc
    if state.get("model") != model_name:
        raise UserError(f"the saved sweep used model {state.get('model')}; resume with that --model")
    if dtype is not None and state.get("dtype", dtype) != dtype:  # a float16 curve never continues a float32 one
        raise UserError(f"the saved sweep ran in {state['dtype']}, not {dtype}; resume with --dtype {state['dtype']}")
    saved = state.get("settings", {})
    wanted = settings.resume_key()
    changed = [name for name in wanted if saved.get(name) != wanted[name]]
    if changed:
        name = changed[0]
        raise UserError(
            f"the saved sweep used {name}={saved.get(name)!r}, not {wanted[name]!r}; "
            "resume with the same settings or run without --resume"
        )
    return state


def checkpointed(events: Iterable[Event], session: Session, state: dict[str, Any]) -> Iterator[Event]:
    """Passes events through; each finished layer is added to the session's checkpoint at once."""
    from engine.events import json_safe
    from engine.experiments.recovery import RecoveryLayer
    from engine.atomic import atomic_write_json

    path = checkpoint_path(session)
    for event in events:
        if isinstance(event, RecoveryLayer):
            state["layers"][str(event.index)] = event.result
            atomic_write_json(path, json_safe(state))
        yield event


def main(args: argparse.Namespace) -> int:
    from engine.experiments.recovery import RecoverySettings, run_recovery

    settings = RecoverySettings(
        layers=parse_layers(args.layers), sigma=args.sigma, steps=args.steps, lr=args.lr,
        batch_size=args.batch_size, block_size=args.block_size, train_blocks=args.train_blocks,
        eval_every=args.eval_every, repeats=args.repeats, seed=args.seed, eval_set=args.eval_set,
        eval_file=str(args.eval_file) if args.eval_file else None,
        train_file=str(args.train_file) if args.train_file else None,
        eval_batch_size=args.eval_batch_size, max_length=args.max_length,
    )
    if args.resume and args.session is None:
        raise UserError("--resume needs --session NAME, the session of the interrupted sweep")
    session, loaded, spec = prepare_run(
        args, settings, [(args.eval_file, "evaluation file"), (args.train_file, "training file")]
    )
    settings.resolve_layers(loaded.n_layers)  # layer range errors before a job is started
    if args.resume:
        state = load_finished(session, settings, loaded.name, loaded.dtype_name)
    else:
        state = {"model": loaded.name, "dtype": loaded.dtype_name, "settings": settings.resume_key(), "layers": {}}
    from sessions.layer_weights import save_layer

    events = run_recovery(
        loaded.model, loaded.tokenizer, settings, model_name=loaded.name,
        done_layers=list(state["layers"].values()), ablation=session.load_result("ablation"),
        keep_weights=lambda index, tensors: save_layer(session, CHECKPOINT_JOB, index, tensors, loaded.name),
    )
    result = drive(session, "recovery", spec, checkpointed(events, session, state), args.json)
    if result is not None:
        print_summary(result.data)
    return 0


def _steps(value: int | None) -> str:
    return "never" if value is None else str(value)


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_summary(doc: dict) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    settings = doc["settings"]
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
        title=f"{doc['model']}  baseline PPL {doc['baseline_ppl']:.2f}  sigma {settings['sigma']}  "
        f"{settings['steps']} steps  lr {settings['lr']}"
    )
    columns = ("layer", "status", "noised", "<2x", "<1.5x", "<1.1x", "best", "final", "x base", "better")
    for column in columns:
        table.add_column(column, justify="right")
    for row in doc["layers"]:
        steps = row["steps_to"]
        table.add_row(
            str(row["index"]), row["status"], _number(row["ppl_after_noise"], ".1f"),
            _steps(steps["2.0"]), _steps(steps["1.5"]), _steps(steps["1.1"]),
            _number(row["best_ppl"], ".2f"), _number(row["final_ppl"], ".2f"),
            _number(row["final_ratio"], ".2f"), "yes" if row["improved_over_baseline"] else "no",
        )
    console = Console()
    console.print(table)
    budget = doc["budget"]
    console.print(f"hardest first: {', '.join(map(str, doc['ranking']))}", highlight=False)
    console.print(f"Spearman(difficulty, ablation D): {doc['spearman_vs_ablation']}", highlight=False)
    console.print(
        f"budget: uniform {budget['uniform_total']} steps, by difficulty {budget['proposed_total']} "
        f"(saves {budget['saving_pct']:.0f}%)", highlight=False,
    )
