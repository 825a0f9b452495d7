"""The worker's side of a Ray task: the run as data (`TaskSpec`), the experiment run on the node
(`run_task`, a streaming generator: where it was placed, then each event as its JSON document), the
driver's files made present there, and the task's checkpoint folder mirrored back as changes
(`CheckpointChange`) that the driver writes into the session (`apply_checkpoint`); each GPU's
memory and compute capability read on its node through NVML.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.core.process import say


@dataclass(frozen=True)
class TaskSpec:
    """One run as data, all a worker needs: the experiment, its settings and model options
    (`to_dict()`, as a job file records them), the session results it reads, and the text of each
    file its settings name (path -> text)."""

    experiment: str
    settings: dict[str, Any]
    options: dict[str, Any] | None
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    resume: bool = False  # --resume: continue from `checkpoint`
    checkpoint: dict[str, bytes] = field(default_factory=dict)  # a resume's checkpoint folder: path in it -> bytes
    cwd: str = ""  # the driver's folder, where a task on its machine works (set by Cluster.run)


@dataclass(frozen=True)
class CheckpointChange:
    """What changed in a task's checkpoint folder since its last word: each file written (its path
    in the folder, POSIX, -> its bytes) in the order they were written, and the paths gone."""

    written: dict[str, bytes]
    gone: tuple[str, ...] = ()


def _gpu_memory_probe() -> list[tuple[int, int, int]]:
    """Each GPU's total bytes and compute capability (major, minor) on this node, through NVML (no
    CUDA context); [] without it."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            found.append((int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), int(major), int(minor)))
        return found
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def run_task(spec: TaskSpec) -> Iterator[dict[str, Any]]:
    """The worker's side: where it was placed, then the experiment run here, each event as its JSON
    document; a UserError as its one line. The model loads on this node (the hub or a path)."""
    import ray

    runtime = ray.get_runtime_context()
    gpus = tuple(str(g) for g in runtime.get_accelerator_ids().get("GPU", []))
    host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # Ray leaves it unannotated
    yield {"placed": {"node_id": runtime.get_node_id(), "host": host, "gpus": gpus, "pid": os.getpid()}}
    from engine.core.frozen_imports import one_job_process
    from engine.experiments.context import RunContext  # torch: after the word of where it runs
    from engine.models.options import ModelOptions
    from engine.registry import experiment

    one_job_process()  # its worker runs this task only (max_calls=1)
    if spec.cwd:  # on the driver's machine: its relative paths (a --model folder) mean what they meant there
        with contextlib.suppress(OSError):
            os.chdir(spec.cwd)
    with tempfile.TemporaryDirectory(prefix="anatomy-tui-task-") as folder:
        moved = _materialize(spec.files, Path(folder))
        try:
            entry = experiment(spec.experiment)
            entry.import_frozen(with_model=spec.options is not None)
            settings = entry.settings_class.from_dict(_swapped(spec.settings, moved))
            model = None
            if spec.options is not None:
                options = ModelOptions.from_dict(spec.options)
                model = options.load(say)
            back = {new: old for old, new in moved.items()}
            checkpoint = Path(folder) / "checkpoint" if entry.resumable else None
            if checkpoint is not None:
                apply_checkpoint(checkpoint, CheckpointChange(spec.checkpoint))
            mirror = _Mirror(checkpoint)
            context = RunContext(model=model, checkpoint_dir=checkpoint, resume=spec.resume, inputs=spec.inputs)
            for event in entry.run(settings, context):
                yield from mirror.changes()  # the checkpoint the experiment wrote before this event, first
                yield {"event": _swapped(event.to_json(), back)}  # the driver's paths, in results too
            yield from mirror.changes()
        except UserError as exc:
            yield {"error": str(exc)}


class _Mirror:
    """The worker's view of its checkpoint folder (None: the experiment keeps none): `changes()`
    yields, at most once a call, the files written and gone since the last call, as a document."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.seen = _marks(folder) if folder is not None else {}

    def changes(self) -> Iterator[dict[str, Any]]:
        if self.folder is None:
            return
        now = _marks(self.folder)
        written: dict[str, bytes] = {}
        for name in sorted((n for n in now if now[n] != self.seen.get(n)), key=lambda n: now[n][1]):
            try:
                written[name] = (self.folder / name).read_bytes()
            except FileNotFoundError:  # removed since: the next call says it is gone
                now.pop(name)
        gone = sorted(set(self.seen) - set(now))
        self.seen = now
        if written or gone:
            yield {"checkpoint": {"written": written, "gone": gone}}


def _marks(folder: Path) -> dict[str, tuple[int, int]]:
    """Each regular file in `folder` (its path there, POSIX) -> (size, mtime in ns); hidden names (an
    atomic write's temporary file) and links left out."""
    found: dict[str, tuple[int, int]] = {}
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in files:
            path = Path(root) / name
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if not name.startswith(".") and stat.S_ISREG(info.st_mode):
                found[path.relative_to(folder).as_posix()] = (info.st_size, info.st_mtime_ns)
    return found


def checkpoint_files(folder: Path) -> dict[str, bytes]:
    """The files of a checkpoint folder (the session's, for a resume), each read without following
    a link (a link in a session folder is a one-line UserError)."""
    from engine.disk.atomic import read_bytes

    return {name: read_bytes(folder / name) for name in _marks(folder)} if folder.is_dir() else {}


def apply_checkpoint(folder: Path, change: CheckpointChange) -> None:
    """Writes `change` into `folder` (each file atomically; a path that leaves the folder, or that is
    hidden, is a one-line UserError: it did not come from a checkpoint folder)."""
    from engine.disk.atomic import atomic_write_bytes, unlinked

    for name, data in change.written.items():
        atomic_write_bytes(_inside(folder, name), data, "checkpoint")
    for name in change.gone:
        unlinked(_inside(folder, name)).unlink(missing_ok=True)


def _inside(folder: Path, name: str) -> Path:
    parts = name.split("/")
    if not name or name.startswith("/") or any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        raise UserError(f"checkpoint file {name!r} is not a plain path inside the checkpoint folder")
    return folder.joinpath(*parts)


def _materialize(files: Mapping[str, str], folder: Path) -> dict[str, str]:
    """The driver's files on this node: where a file of the same lines is at the same path (a local
    cluster, a shared disk) it is read there; else its text is written into `folder`. Returns
    driver path -> path here, for those written."""
    from engine.core.files import path_kind, read_lines

    moved: dict[str, str] = {}
    for index, (path, text) in enumerate(sorted(files.items())):
        lines = [line for line in (piece.strip() for piece in text.splitlines()) if line]
        if path_kind(Path(path), "file") == "file" and read_lines(Path(path), "file") == lines:
            continue
        here = folder / f"{index}-{Path(path).name}"
        here.write_text(text, encoding="utf-8")
        moved[path] = str(here)
    return moved


def _swapped(doc: Any, paths: Mapping[str, str]) -> Any:
    """`doc` with every string that is a key of `paths` replaced by its value."""
    if not paths:
        return doc
    if isinstance(doc, str):
        return paths.get(doc, doc)
    if isinstance(doc, dict):
        return {key: _swapped(value, paths) for key, value in doc.items()}
    if isinstance(doc, list):
        return [_swapped(value, paths) for value in doc]
    return doc


@functools.cache
def task_function() -> Any:
    """`run_task` as a Ray streaming generator, made at first use (Ray is imported then). Each task
    has a worker process of its own (max_calls=1): a task cancelled in the middle of an import or a
    load leaves no half-imported module to the next (a reused worker once failed every later task
    with scipy's `NameError: _ndimage_api`), and a model's memory goes back when its task ends."""
    import ray

    return ray.remote(num_returns="streaming", max_calls=1)(run_task)


@functools.cache
def gpu_probe() -> Any:
    import ray

    return ray.remote(num_cpus=0)(_gpu_memory_probe)
