"""`anatomy-tui export SESSION --model recovered|growth|uniform DIR`: a model the session made,
saved as a Hugging Face folder (engine.export.folder); `--push-to-hub REPO` uploads it (or,
with `--model pruned`, the folder `run prune --export` saved) to the Hub."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from cli.flags import add_settings_arguments
from engine.core.errors import UserError
from engine.disk.session_layout import GROWTH_MODELS
from engine.experiments.session_models import (
    SAVED_ARMS,  # growth and uniform: their arm's folder under <session>/GROWTH_MODELS
)
from engine.models.options import ModelOptions

EXPORT_LOAD = ModelOptions(device="cpu")  # the base model loads on the CPU unless --device says otherwise
LOAD_FLAGS = ("device", "dtype")  # of the model options, the ones export takes (--model is what to export)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help="the session that made the model")
    parser.add_argument("folder", type=Path, help="where to save the Hugging Face folder (--model pruned: the "
                                                  "folder run prune --export saved)")
    parser.add_argument("--model", required=True, choices=("recovered", *SAVED_ARMS, "pruned"),
                        help="recovered: the session's model with recovery's fine-tuned layers put in; "
                             "growth, uniform: the growth experiment's models; pruned: the folder the "
                             "session's `run prune --export` saved, as it is (to push it with --push-to-hub)")
    parser.add_argument("--force", action="store_true", help="export into a folder that is not empty")
    parser.add_argument("--push-to-hub", metavar="REPO", default=None,
                        help="then upload the folder to this Hub model repository (made if missing); "
                             "needs your token: HF_TOKEN or `hf auth login`")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: make the repository private")
    # where the base model loads (recovered): --device and --dtype as declared for every model run
    add_settings_arguments(parser, EXPORT_LOAD, {"--model", "--force", "--push-to-hub", "--private", "-h", "--help"},
                           only=LOAD_FLAGS)
    parser.set_defaults(**{name: getattr(EXPORT_LOAD, name) for name in LOAD_FLAGS})  # over the console's


def main(args: argparse.Namespace) -> int:
    from engine.experiments.growth.export import export_growth
    from engine.export.folder import check_export_folder, export_recovered, hub_token
    from engine.export.model_card import hub_id
    from sessions.store import SessionStore

    if args.push_to_hub is not None:
        hub_token()  # before the export: no token, one line, nothing done
    elif args.private:
        raise UserError("--private needs --push-to-hub REPO")

    store = SessionStore()
    store.check_home(writing=False)  # reads the session only: a read-only sessions folder is fine
    session = store.open(args.session)
    if args.model == "pruned":
        folder = pruned_folder(session.results().get("prune"), args.session)
        if folder.resolve() != args.folder.expanduser().resolve() or args.push_to_hub is None:
            raise UserError(f"--model pruned is the folder run prune exported: give it as DIR ({folder}) "
                            "with --push-to-hub REPO to upload it")
        prune = session.results()["prune"]
        cut = (prune.get("exported_point") or {}).get("layers") or []
        variant, label = ("healed", None) if prune.get("heal") else ("pruned", f"pruned -{','.join(map(str, cut))}")
        with_accuracy(folder, session.results().get("evaluate"), variant, label, model=prune.get("model"))
        return push(folder, args)
    check_export_folder(args.folder, args.force)
    results = session.results()
    if args.model in SAVED_ARMS:
        from engine.disk.atomic import inside

        saved = inside(session.part(GROWTH_MODELS, SAVED_ARMS[args.model]), session.path, "the session's growth run")
        folder = export_growth(saved, args.folder, args.force)
        with_accuracy(folder, results.get("evaluate"), args.model)
    else:
        from sessions.layer_weights import load_layers

        name = str(session.manifest.get("model", ""))
        if not name:
            raise UserError(f"session {args.session} records no model; nothing to put recovered layers into")
        given = {field: getattr(args, field) for field in LOAD_FLAGS}
        loaded = replace(EXPORT_LOAD, model=name).override(given).load()
        layers = load_layers(session, "recovery", loaded.name)
        folder = export_recovered(loaded.model, loaded.tokenizer, layers, args.folder, loaded.name, args.force,
                                  base_model=hub_id(loaded.name, loaded.source),
                                  recovery=results.get("recovery"))
        with_accuracy(folder, results.get("evaluate"), "recovered", model=loaded.name)
    print(f"exported {args.model} model of session {session.name} to {folder}", file=sys.stderr)
    return push(folder, args) if args.push_to_hub is not None else 0


def pruned_folder(prune: dict | None, session: str) -> Path:
    """The folder the session's prune run exported, checked to be there still."""
    from engine.export.model_card import CARD

    exported = (prune or {}).get("exported")
    if not exported:
        raise UserError(f"session {session} has no exported prune; run prune with --export DIR first")
    folder = Path(exported)
    if not (folder / CARD).is_file():
        raise UserError(f"the prune export {folder} is gone or incomplete; export it again")
    return folder


def with_accuracy(folder: Path, evaluation: dict | None, variant: str, label: str | None = None,
                  model: str | None = None) -> None:
    """lm-eval's scores of the exported model into its card, where the session's evaluate result
    has them: its row of that variant (and label), evaluated on the same model."""
    from engine.export.model_card import add_accuracy

    if not evaluation or (model is not None and evaluation.get("model") != model):
        return
    for row in evaluation.get("models") or []:
        if row.get("variant") == variant and label in (None, row.get("label")) and row.get("scores"):
            add_accuracy(folder, row["scores"], evaluation.get("protocol"),
                         f"the session's evaluate result, {row.get('label')}: {row.get('description')}")
            print(f"the card carries lm-eval's scores of {row.get('label')} from the session", file=sys.stderr)
            return


def push(folder: Path, args: argparse.Namespace) -> int:
    from engine.export.folder import push_to_hub

    url = push_to_hub(folder, args.push_to_hub, private=args.private)
    print(f"pushed {folder} to {url}", file=sys.stderr)
    return 0
