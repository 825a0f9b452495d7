"""`anatomy-tui compare S1 S2 ... | --atlas NAME`: per-layer profiles of several sessions (or an
atlas's models) on relative depth, one line per model, their class bands, the depths where every
model's layers are critical or all redundant, and how far the criteria agree (engine/atlas/table.py;
the text: tui/views/atlas.py, also the console's Compare view). Sessions of one model (original and
pruned, two texts, two dtypes) also compare layer by layer."""

from __future__ import annotations

import argparse

from engine.atlas import table as A
from engine.core.errors import UserError
from tui.views.atlas import print_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sessions", nargs="*", metavar="SESSION", help="sessions to compare (two or more)")
    parser.add_argument("--atlas", default=None, metavar="NAME", help="compare the models of this atlas")
    parser.add_argument("--bins", type=int, default=A.DEFAULT_BINS, metavar="N",
                        help=f"relative-depth bins (default {A.DEFAULT_BINS})")


def main(args: argparse.Namespace) -> int:
    from sessions.atlas import compare_sessions, saved_atlas
    from sessions.store import SessionStore

    store = SessionStore()
    if args.atlas is not None:
        if args.sessions:
            raise UserError("compare takes sessions or --atlas NAME, not both")
        print_report(saved_atlas(store, args.atlas))
    else:
        print_report(compare_sessions(store, args.sessions, args.bins))
    return 0
