"""The Compare view's read of an atlas under way, twice a second: AtlasWatch.tasks() (only what the
logs gained since its last read) against reading every log from where each measure began
(`atlas_tasks`, a new watch each time: the straightforward version).

    python benchmarks/atlas_watch.py [--measures 32] [--events 5000] [--ticks 20]

An atlas of `--measures` measures, all under way on a cluster, each job `--events` progress events
long so far; each tick adds one progress event to every job, then both read. The last line is
`ratio fresh / incremental: X`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--measures", type=int, default=32)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as home:
        os.environ["ANATOMY_TUI_HOME"] = home
        from engine.core.events import Progress, Started, TaskState
        from sessions.atlas import AtlasWatch, atlas_tasks
        from sessions.store import SessionStore

        store = SessionStore()
        atlas = store.create("bench", settings={"atlas": {}})
        members = []
        for index in range(args.measures):
            member = store.create(f"bench-m{index}", model=f"m{index}")
            atlas.append_event(TaskState("queued", "in the driver", f"m{index}|main|ablation", member.name))
            member.append_event(Started(experiment="ablation", spec={}, job="j"))
            with member.events_path.open("a", encoding="utf-8") as log:  # the job so far, written at once
                log.writelines(f'{{"v": 2, "kind": "job.progress", "job": "j", "t": 0, "done": {i}, '
                               f'"total": 1000000, "label": "ablation"}}\n' for i in range(args.events))
            members.append(member)
        watch = AtlasWatch(store, "bench")
        watch.tasks()  # the first read, as the view opens
        incremental = fresh = 0.0
        for tick in range(args.ticks):
            for member in members:
                member.append_event(Progress(args.events + tick, 1000000, "ablation", job="j"))
            start = time.perf_counter()
            mine = watch.tasks()
            incremental += time.perf_counter() - start
            start = time.perf_counter()
            again = atlas_tasks(store, "bench")
            fresh += time.perf_counter() - start
            assert mine == again, "the two reads disagree"
    print(f"{args.measures} measures under way, {args.events} events each, {args.ticks} ticks")
    print(f"incremental (AtlasWatch.tasks): {incremental / args.ticks * 1000:.2f} ms a tick")
    print(f"fresh (atlas_tasks, every log from each measure's start): {fresh / args.ticks * 1000:.2f} ms a tick")
    print(f"ratio fresh / incremental: {fresh / incremental:.1f}")


if __name__ == "__main__":
    main()
