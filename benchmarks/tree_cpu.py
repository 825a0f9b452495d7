"""The CPU time of a command and of every process it starts, Ray's daemons and workers included
(they are not waited for by their parents, so `/usr/bin/time` misses them): the command runs
under this process made a child subreaper, every descendant's user+system time is sampled each
0.1 s (one that ends between samples loses at most its last 0.1 s).

    python3 benchmarks/tree_cpu.py python3 -m pytest -q -n 0 tests/test_cluster.py -p no:cacheprovider
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
TICK = os.sysconf("SC_CLK_TCK")


def descendants_cpu(root: int) -> dict[tuple[int, int], float]:
    """Each descendant of `root` (by pid and start time): its user+system seconds so far."""
    stats: dict[int, tuple[int, int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(name)] = (int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / TICK)
    found = {}
    for pid, (_, start, cpu) in stats.items():
        up, depth = pid, 0
        while up in stats and up != root and depth < 64:
            up, depth = stats[up][0], depth + 1
        if up == root and pid != root:
            found[(pid, start)] = cpu
    return found


def main(argv: list[str]) -> int:
    ctypes.CDLL("libc.so.6").prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    seen: dict[tuple[int, int], float] = {}
    began = time.monotonic()
    process = subprocess.Popen(argv)
    while process.poll() is None:
        for key, cpu in descendants_cpu(os.getpid()).items():
            seen[key] = max(seen.get(key, 0.0), cpu)
        time.sleep(0.1)
        while True:  # reap the orphans handed to this process
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
    print(f"exit {process.returncode}: wall {time.monotonic() - began:.1f} s, CPU {sum(seen.values()):.1f} s "
          f"in {len(seen)} processes", flush=True)
    return process.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
