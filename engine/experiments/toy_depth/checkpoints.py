"""toy-depth's checkpoints: one per trained group of students.

Every student's result depends only on (regime, temperature, depth) and the settings: the teacher
and held-out inputs are rebuilt from the seed, and each depth has its own generator. So a resumed
run restores the finished students from their files and trains the rest, giving exactly the numbers
of an uninterrupted run. A student's JSON is written after its weights: it marks the student done."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from engine.core.errors import UserError
from engine.disk.atomic import atomic_write_bytes, atomic_write_json, read_json
from engine.experiments.toy_depth.networks import Students
from engine.experiments.toy_depth.vocabulary import ToyDepthSettings

RUN_FILE = "toy-depth-run.json"


def student_name(regime: str, temperature: float, depth: int) -> str:
    return f"student-{regime}-T{temperature!r}-d{depth}"


def _student_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("student-*") if p.suffix in (".json", ".safetensors"))


def prepare_checkpoints(folder: Path, settings: ToyDepthSettings, resume: bool) -> None:
    """A fresh run clears the folder's student checkpoints and records its settings; a resume checks
    that the recorded settings are these, and refuses in one line otherwise."""
    folder = Path(folder)
    run_file = folder / RUN_FILE
    if resume:
        if not run_file.is_file():
            raise UserError(f"nothing to resume: no toy-depth checkpoint in {folder}; run without --resume")
        try:
            saved = read_json(run_file)["settings"]
            if not isinstance(saved, dict):
                raise TypeError("settings is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"the toy-depth checkpoint {run_file} is damaged ({exc}); run without --resume") from None
        now = settings.resume_key()
        differ = sorted(k for k in set(now) | set(saved) if saved.get(k) != now.get(k))
        if differ:
            k = differ[0]
            raise UserError(f"the checkpoint was made with other settings ({k}: {saved.get(k)} there, "
                            f"{now.get(k)} now); resume with the same settings or run without --resume")
        return
    folder.mkdir(parents=True, exist_ok=True)
    for path in _student_files(folder):
        path.unlink()
    atomic_write_json(run_file, {"experiment": "toy-depth", "settings": settings.resume_key()})


def save_student(folder: Path, name: str, students: Students) -> None:
    from safetensors.torch import save

    tensors = {k: v.detach().contiguous().clone() for k, v in students.state_dict().items()}
    atomic_write_bytes(Path(folder) / f"{name}.safetensors", save(tensors))


def finish_student(folder: Path, name: str, record: dict[str, Any]) -> None:
    atomic_write_json(Path(folder) / f"{name}.json", record)


def load_student(folder: Path, name: str, regime: str, temperature: float, depth: int, seeds: int
                 ) -> tuple[dict[str, Any] | None, str]:
    """A finished student's record, checked field by field; (None, why) if absent or damaged."""
    path = Path(folder) / f"{name}.json"
    if not path.is_file():
        return None, "absent"
    if not (Path(folder) / f"{name}.safetensors").is_file():
        return None, "its weights are missing"
    try:
        record = read_json(path)
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({exc})"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    if (record.get("regime"), record.get("temperature"), record.get("depth")) != (regime, temperature, depth):
        return None, "it belongs to another student"
    losses, seconds = record.get("losses"), record.get("seconds")
    if (not isinstance(losses, list) or len(losses) != seeds
            or not all(isinstance(v, float) and math.isfinite(v) for v in losses)):
        return None, f"its losses are not {seeds} finite numbers"
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
        return None, "its seconds are not a number"
    return record, ""


def prepare_run(checkpoint_dir: Path | None, resume: bool, settings: ToyDepthSettings) -> None:
    """The checkpoint folder made ready before any student trains (cleared, or checked for --resume)."""
    if resume and checkpoint_dir is None:
        raise UserError("--resume needs the session whose toy-depth run to continue (--session NAME)")
    if checkpoint_dir is not None:
        prepare_checkpoints(checkpoint_dir, settings, resume)
