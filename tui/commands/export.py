"""`anatomy-tui export SESSION --model recovered|growth|uniform DIR`: a model the session made,
saved as a Hugging Face folder (engine.experiments.export)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.errors import UserError
from engine.options import DTYPES
from engine.variants import SAVED_ARMS  # growth and uniform: their arm's folder under <session>/growth_models


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help="the session that made the model")
    parser.add_argument("folder", type=Path, help="where to save the Hugging Face folder")
    parser.add_argument("--model", required=True, choices=("recovered", *SAVED_ARMS),
                        help="recovered: the session's model with recovery's fine-tuned layers put in; "
                             "growth, uniform: the growth experiment's models")
    parser.add_argument("--force", action="store_true", help="export into a folder that is not empty")
    parser.add_argument("--device", default="cpu", help="where to load the base model (recovered; default cpu)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES)


def main(args: argparse.Namespace) -> int:
    from engine.experiments.export import check_export_folder, export_growth, export_recovered
    from sessions.store import SessionStore

    session = SessionStore().open(args.session)
    check_export_folder(args.folder, args.force)
    if args.model in SAVED_ARMS:
        folder = export_growth(session.path / "growth_models" / SAVED_ARMS[args.model], args.folder, args.force)
    else:
        from engine.models import load_model
        from sessions.layer_weights import load_layers

        name = str(session.manifest.get("model", ""))
        if not name:
            raise UserError(f"session {args.session} records no model; nothing to put recovered layers into")
        loaded = load_model(name, device=args.device, dtype=args.dtype)
        layers = load_layers(session, "recovery", loaded.name)
        folder = export_recovered(loaded.model, loaded.tokenizer, layers, args.folder, loaded.name, args.force)
    print(f"exported {args.model} model of session {session.name} to {folder}", file=sys.stderr)
    return 0
