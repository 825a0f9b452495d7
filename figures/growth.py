"""Growth against uniform: the growth arm's phases shaded on the step axis with the network drawn
growing (each layer a bar as thick as its FFN width, from the phase that adds it), the uniform arm
the same way, and each arm's validation loss curve on the same step axis, ending in its final loss
with its spread over seeds."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from engine.evaluation.statistics import CLASSES
from engine.experiments.growth.vocabulary import GrowthResult
from figures import style

SHADES = ("0.93", "0.85")


def class_name(text: str) -> str:
    """A profile entry (`critical`, or the sample's `C`) as its class; `anti` and unknown as redundant."""
    text = text.strip().lower()
    return next((name for name in CLASSES if name == text or name[0] == text), "redundant")


def layer_bars(ax: Axes, start: float, steps: float, layers: Sequence[int], thickness: Sequence[float],
               classes: Sequence[str]) -> None:
    for layer in layers:
        share = thickness[layer] if layer < len(thickness) else 1.0
        look = style.class_look(classes[layer]) if layer < len(classes) else style.NO_CLASS_LOOK
        ax.barh(layer, steps, left=start, height=0.85 * share, color=look.color, hatch=look.hatch,
                edgecolor="black", linewidth=0.3)


def timeline(ax: Axes, phases: Sequence[tuple[str, float, float, Sequence[int], float]], widths: Sequence[float],
             classes: Sequence[str], widest: float, n_layers: int) -> None:
    """Phases (name, start, steps, layers, ffn scale) shaded in turn, the layers each one trains."""
    for index, (name, start, steps, layers, scale) in enumerate(phases):
        ax.axvspan(start, start + steps, color=SHADES[index % 2], zorder=0, linewidth=0)
        # neighbouring names alternate between two rows, so short phases' names do not overlap
        ax.text(start + steps / 2, n_layers - 0.35 + 0.9 * (index % 2), name, ha="center", va="bottom", fontsize=5)
        layer_bars(ax, start, steps, layers, [w * scale / widest for w in widths], classes)
    ax.set_ylim(-0.6, n_layers + 1.2)
    ax.set_ylabel("layer")
    ax.set_yticks(range(0, n_layers, max(1, round(n_layers / 6))))


def loss_curves(ax: Axes, result: GrowthResult) -> None:
    """Each arm's validation loss at the steps it was evaluated (mean over seeds), its final loss
    with the spread over seeds as an error bar at its last step: the paper's growth-vs-uniform plot."""
    for index, (name, arm) in enumerate(result.arms.items()):
        look = style.series(index)
        steps = [step for step, _ in arm.curve or ()]
        ax.plot(steps, [loss for _, loss in arm.curve or ()], label=name, **look)
        ax.errorbar([arm.steps], [arm.mean], yerr=[arm.sd] if arm.sd else None, color=look["color"],
                    marker=look["marker"], capsize=2)
    ax.legend(fontsize=5.5, ncols=len(result.arms), loc="upper right")
    ax.set_xlabel("optimizer step")


def final_losses(ax: Axes, result: GrowthResult) -> None:
    names = list(result.arms)
    for index, name in enumerate(names):
        arm = result.arms[name]
        ax.bar(index, arm.mean, yerr=arm.sd if arm.sd else None, label=name, **style.bar_look(index))
    ax.set_xticks(range(len(names)), names)
    ax.legend(fontsize=5.5, ncols=max(len(names), 1), loc="upper right")
    means = [result.arms[n].mean for n in names]
    if means:
        ax.set_ylim(min(means) * 0.9, max(means) * 1.05)


def draw(result: GrowthResult) -> Figure:
    classes = [class_name(c) for c in result.profile if c.strip().lower() != "anti"]
    growth_widths = result.widths.growth or [1] * len(classes)
    n_layers = len(growth_widths)
    uniform = result.widths.uniform or max(growth_widths)
    widest = max(*growth_widths, uniform)
    fig = style.figure(height=3.3)
    grown, flat, losses = fig.subplots(3, 1, height_ratios=(1.3, 1.0, 1.0))
    phases = [(str(p["name"]), float(p["start"]), float(p["steps"]), [int(x) for x in p["layers"]],
               float(p.get("ffn_scale", 1.0))) for p in result.phases]
    timeline(grown, phases, growth_widths, classes, widest, n_layers)
    grown.set_title(f"growth arm: phases, FFN widths {min(growth_widths)}–{max(growth_widths)}")
    uniform_arm = result.arms.get("uniform_100")
    uniform_steps = float(uniform_arm.steps) if uniform_arm else max((s + n for _, s, n, _, _ in phases), default=1)
    timeline(flat, [("uniform", 0.0, uniform_steps, range(n_layers), 1.0)], [uniform] * n_layers, [],
             widest, n_layers)
    flat.set_title(f"uniform arm: FFN width {uniform}")
    flat.set_xlabel("optimizer step")
    flat.sharex(grown)
    style.class_legend(grown, [c for c in CLASSES if c in classes], False, unclassed=True, loc="upper left", ncols=5,
                       columnspacing=0.8, handlelength=1.4,
                       bbox_to_anchor=(0.0, 1.45), fontsize=5.5)
    if any(arm.curve for arm in result.arms.values()):
        loss_curves(losses, result)
        losses.sharex(grown)
    else:  # a result of 0.3 kept only each arm's final loss
        final_losses(losses, result)
    losses.set_ylabel("validation loss")
    return fig
