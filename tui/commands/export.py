"""`anatomy-tui export SESSION --model recovered|growth|uniform DIR`: a model the session made,
saved as a Hugging Face folder (engine.experiments.export)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from engine.errors import UserError
from engine.options import ModelOptions
from engine.session_layout import GROWTH_MODELS
from engine.variants import SAVED_ARMS  # growth and uniform: their arm's folder under <session>/GROWTH_MODELS
from tui.flags import add_settings_arguments

EXPORT_LOAD = ModelOptions(device="cpu")  # the base model loads on the CPU unless --device says otherwise
LOAD_FLAGS = ("device", "dtype")  # of the model options, the ones export takes (--model is what to export)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help="the session that made the model")
    parser.add_argument("folder", type=Path, help="where to save the Hugging Face folder")
    parser.add_argument("--model", required=True, choices=("recovered", *SAVED_ARMS),
                        help="recovered: the session's model with recovery's fine-tuned layers put in; "
                             "growth, uniform: the growth experiment's models")
    parser.add_argument("--force", action="store_true", help="export into a folder that is not empty")
    # where the base model loads (recovered): --device and --dtype as declared for every model run
    add_settings_arguments(parser, EXPORT_LOAD, {"--model", "--force", "-h", "--help"}, only=LOAD_FLAGS)
    parser.set_defaults(**{name: getattr(EXPORT_LOAD, name) for name in LOAD_FLAGS})  # over the console's


def main(args: argparse.Namespace) -> int:
    from engine.experiments.export import check_export_folder, export_growth, export_recovered
    from sessions.store import SessionStore

    store = SessionStore()
    store.check_home(writing=False)  # reads the session only: a read-only sessions folder is fine
    session = store.open(args.session)
    check_export_folder(args.folder, args.force)
    if args.model in SAVED_ARMS:
        folder = export_growth(session.path / GROWTH_MODELS / SAVED_ARMS[args.model], args.folder, args.force)
    else:
        from sessions.layer_weights import load_layers

        name = str(session.manifest.get("model", ""))
        if not name:
            raise UserError(f"session {args.session} records no model; nothing to put recovered layers into")
        given = {field: getattr(args, field) for field in LOAD_FLAGS}
        loaded = replace(EXPORT_LOAD, model=name).override(given).load()
        layers = load_layers(session, "recovery", loaded.name)
        folder = export_recovered(loaded.model, loaded.tokenizer, layers, args.folder, loaded.name, args.force)
    print(f"exported {args.model} model of session {session.name} to {folder}", file=sys.stderr)
    return 0
