"""Growth training speed on the tiny preset, in one run: tokens/s of every growth phase against the
full model (the uniform baseline, and the grown model once complete), then the wall-time ratio of
uniform over growth at the same budget (optimizer steps x batch tokens). Training seconds only:
evaluation, checkpoints and generation are not counted. The paper: 59.6 s / 52.0 s = 1.15.

    python benchmarks/growth.py
"""

from __future__ import annotations

from engine.experiments.growth.experiment import preset_settings, run_growth
from engine.experiments.growth.vocabulary import GrowthArmDone, GrowthPhase, GrowthPhaseEnd


def main() -> None:
    settings = preset_settings("tiny", arms=("growth_100", "uniform_100"))
    layers: dict[tuple[str, str], int] = {}
    ends: list[GrowthPhaseEnd] = []
    done: dict[str, GrowthArmDone] = {}
    for event in run_growth(settings):
        if isinstance(event, GrowthPhase):
            layers[(event.arm, event.phase)] = len(event.layers)
        elif isinstance(event, GrowthPhaseEnd):
            ends.append(event)
        elif isinstance(event, GrowthArmDone):
            done[event.arm] = event
    full = done["uniform_100"].tokens_per_s
    tokens = settings.batch_size * settings.seq_len
    print(f"tiny preset, {tokens} tokens a step, torch threads {settings.threads}")
    print(f"{'arm':12} {'phase':14} {'layers':>6} {'steps':>6} {'seconds':>8} {'tokens/s':>9} {'vs full':>8}")
    for end in ends:
        print(
            f"{end.arm:12} {end.phase:14} {layers[(end.arm, end.phase)]:>6} {end.steps:>6} "
            f"{end.seconds:>8.2f} {end.tokens_per_s:>9.0f} {end.tokens_per_s / full:>7.2f}x"
        )
    growth, uniform = done["growth_100"], done["uniform_100"]
    for arm in (growth, uniform):
        print(f"{arm.arm}: {arm.steps} steps, {arm.seconds:.1f} s, {arm.tokens_per_s:.0f} tokens/s, "
              f"final val loss {arm.val_loss:.4f}")  # fmt: skip
    print(f"ratio growth_vs_uniform_seconds: {uniform.seconds / growth.seconds:.3f}")


if __name__ == "__main__":
    main()
