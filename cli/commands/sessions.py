"""`anatomy-tui sessions list|show`: every session, a damaged one (a file too large or too deeply
nested, a forged field) listed as damaged with its reason, never stopping the others."""

from __future__ import annotations

import argparse
import json
import time

from engine.core.untrusted import printable
from sessions.store import SessionStore


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else "-"


def main(args: argparse.Namespace) -> int:
    store = SessionStore()
    store.check_home(writing=False)  # a file: one line; a read-only folder still lists (nothing is written)
    if args.sessions_command == "list":
        infos = store.list()
        if not infos:
            print(f"no sessions yet in {store.home}")
        for info in infos:  # each line escaped: a folder's name or a forged file's text is never a terminal's command
            if not info.openable:
                print(printable(f"{info.name:28} DAMAGED: {info.damaged}"))
                continue
            jobs = "".join(
                [f"  running: {','.join(info.running)}" if info.running else "",
                 f"  interrupted: {','.join(info.interrupted)}" if info.interrupted else "",
                 f"  stale: {','.join(info.stale)}" if info.stale else ""]
            )
            results = ",".join(info.results) or "-"
            damage = f"  damaged: {info.damaged}" if info.damaged else ""
            line = f"{info.name:28} {_when(info.updated):17} {info.model:20} results: {results}{jobs}{damage}"
            print(printable(line))
        return 0
    session = store.open(args.name)
    print(json.dumps(  # ASCII: every control character of a forged file escaped
        {
            "path": str(session.path),
            "manifest": session.manifest,
            "results": sorted(session.results()),
            "jobs": {name: {k: doc.get(k) for k in ("experiment", "status", "pid", "error")}
                     for name, doc in session.jobs().items()},
            "damage": session.damage,
        }, indent=2
    ))
    return 0
