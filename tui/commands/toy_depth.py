"""`anatomy-tui run toy-depth`: students of several depths imitate a deeper teacher; fitted a_l.

Flags default to None: only the given ones replace fields of the chosen preset, so the values live
in one place (engine/experiments/toy_depth.py) and this module imports nothing heavy until main().
"""

from __future__ import annotations

import argparse
import sys

from tui.commands.common import add_session_arguments, comma_list, drive, open_session

# flag -> (settings field, parser, help)
_FLAGS: tuple[tuple[str, str, object, str], ...] = (
    ("--width", "width", int, "residual width (paper 32)"),
    ("--outputs", "outputs", int, "number of output classes (paper 128)"),
    ("--teacher-depth", "teacher_depth", int, "teacher layers (paper 128, tiny 32)"),
    ("--student-depths", "student_depths", comma_list(int, "--student-depths"),
     "student depths, comma-separated (paper 6,12,16,24,32,48)"),
    ("--regimes", "regimes", comma_list(str, "--regimes"), "teachers to run, from tied,independent"),
    ("--temperatures", "temperatures", comma_list(float, "--temperatures"),
     "target temperatures, comma-separated; the first is the primary one"),
    ("--steps", "steps", int, "training steps per student"),
    ("--batch-size", "batch_size", int, "fresh Gaussian inputs per step (shared by the seeds)"),
    ("--lr", "lr", float, "Adam learning rate (cosine decay to zero)"),
    ("--seeds", "seeds", int, "students per depth (trained together, independent)"),
    ("--eval-size", "eval_size", int, "held-out inputs for the final loss"),
    ("--bootstrap", "bootstrap", int, "bootstrap resamples for the a_l interval"),
    ("--log-every", "log_every", int, "emit a training-loss event every N steps"),
    ("--seed", "seed", int, "random seed of teachers, students and data"),
    ("--threads", "threads", int, "torch CPU threads while training"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="tiny", choices=["tiny", "paper"],
                        help="tiny: minutes on 2 CPU cores (default); paper: the reference settings")
    for flag, dest, kind, help_text in _FLAGS:
        parser.add_argument(flag, dest=dest, type=kind, default=None, help=f"{help_text}; default: preset")
    parser.add_argument("--fit-floor", action=argparse.BooleanOptionalAction, default=None,
                        help="fit L = c/l^a + L0 instead of L = c/l^a (default: the preset's, off)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run checkpointed in --session: finished students are restored "
                             "(give the same preset and flags)")
    add_session_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from engine.errors import UserError
    from engine.experiments.toy_depth import check_settings, preset_settings, run_toy_depth

    overrides = {dest: getattr(args, dest) for _, dest, _, _ in _FLAGS}
    overrides["fit_floor"] = args.fit_floor
    settings = preset_settings(args.preset, **overrides)
    check_settings(settings)
    if args.resume and args.session is None:
        raise UserError("--resume needs --session NAME: the session whose toy-depth run to continue")
    spec = {"preset": args.preset, **asdict(settings)}
    session = open_session(args, spec)
    events = run_toy_depth(settings, preset=args.preset, checkpoint_dir=session.checkpoint_dir("toy-depth"),
                           resume=args.resume)
    result = drive(session, "toy-depth", {**spec, "resume": args.resume}, events, args.json)
    if result is None:
        print(f"stopped; continue with the same flags and: --session {session.name} --resume", file=sys.stderr)
        return 1
    for regime, doc in result.data["regimes"].items():
        ci = doc["ci95"]
        interval = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "n/a"
        alpha = f"{doc['alpha_l']:.2f}" if doc["alpha_l"] is not None else "n/a"
        print(f"{regime:12s} alpha_l {alpha}  95% {interval}  loss by depth "
              + " ".join(f"{d}:{v:.4f}" for d, v in zip(doc["depths"], doc["loss"], strict=True)))
    return 0
