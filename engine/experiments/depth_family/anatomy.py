"""Every trained member's anatomy on the family's held-out windows, and the anatomy against depth.

The layer map is the ablation experiment's (`run_ablation`, its rows and classes), each layer
skipped (its input passed through: the one removal defined at every depth, a one-layer member
included). The angles are the dynamics experiment's profiles (`stream_profiles`, `layer_rows`): the
median angle between each layer's input and output, and between consecutive layers' updates.
Against depth: the mean over a depth's members of each summary, with a 95 % Student-t interval over
the members (seeds, and widths and budgets where they vary)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from engine.core.codec import from_doc
from engine.core.events import CancelToken, Result
from engine.data.eval_data import PAPERS, EvalProtocol, EvalSource, Windows
from engine.evaluation.perplexity import window_batches
from engine.experiments.ablation.run import run_ablation
from engine.experiments.ablation.vocabulary import AblationMap, AblationSettings
from engine.experiments.depth_family.vocabulary import AnatomyRow, DepthFamilySettings, Member, MemberAnatomy
from engine.experiments.dynamics.clusters import layer_rows
from engine.experiments.dynamics.profiles import Profiles, stream_profiles

METHOD = "skip"


def heldout_source(windows: Any, count: int) -> EvalSource:
    """The first `count` held-out windows, each scored on every token after its first."""
    rows = tuple(tuple(row) for row in windows[:count].tolist())
    context = len(rows[0])
    protocol = EvalProtocol(dataset="depth-family held-out split", config=None, split=None, revision=None,
                            text_column=None, protocol=PAPERS, context=context, stride=None, windows=len(rows),
                            tokens=len(rows) * (context - 1))
    return EvalSource(None, Windows(rows, (context - 1,) * len(rows)), protocol.dataset, protocol)


def member_anatomy(model: Any, tokenizer: Any, source: EvalSource, settings: DepthFamilySettings,
                   cancel: CancelToken | None = None) -> MemberAnatomy:
    """The member's layer map and angle dynamics (model on the run's device, in eval mode); the two
    experiments' own events are not passed on (the family's log says each member once)."""
    ablation = AblationSettings(method=METHOD, eval_batch_size=settings.batch_size,
                                max_length=settings.context + 1)
    found: AblationMap | None = None
    for item in run_ablation(model, tokenizer, ablation, cancel, source=source):
        if isinstance(item, Result):
            found = from_doc(AblationMap, item.data)
    assert found is not None  # run_ablation ends with its map
    assert source.windows is not None
    device = next(model.parameters()).device
    batches = window_batches(source.windows, settings.batch_size, 0, device)
    profiles: Profiles | None = None
    for part in stream_profiles(model, batches, include_first=False, cancel=cancel):
        if isinstance(part, Profiles):
            profiles = part
    assert profiles is not None  # stream_profiles ends with them
    layers = layer_rows(profiles, None)
    state = [row.angle_state.median for row in layers]
    update = [row.angle_update.median for row in layers[:-1]]
    known_state = [v for v in state if v is not None]
    known_update = [v for v in update if v is not None]
    redundant = sum(row.layer_class == "redundant" for row in found.layers) / len(found.layers)
    return MemberAnatomy(
        map=found.layers, baseline_ppl=found.baseline_ppl, angle_state=state, angle_update=update,
        redundant_share=redundant, mean_angle=float(np.mean(known_state)) if known_state else None,
        neighbour_similarity=float(np.mean([math.cos(math.radians(v)) for v in known_update]))
        if known_update else None)


def mean_interval(values: Sequence[float], bounds: tuple[float, float]) -> tuple[float | None, list[float] | None]:
    """The mean and its 95 % Student-t interval (None with fewer than two values), kept within the
    measure's possible `bounds`: two seeds' shares 0 and 0.6 give a t interval below 0 otherwise."""
    if not values:
        return None, None
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, None
    half = float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values)))
    return mean, [max(mean - half, bounds[0]), min(mean + half, bounds[1])]


def anatomy_by_depth(members: Sequence[Member]) -> list[AnatomyRow]:
    """Per depth: the members' mean share of redundant layers, mean angle and neighbour similarity."""
    rows = []
    for depth in sorted({m.depth for m in members}):
        found = [m.anatomy for m in members if m.depth == depth and m.anatomy is not None]
        if not found:
            continue
        share = mean_interval([a.redundant_share for a in found], (0.0, 1.0))
        angle = mean_interval([a.mean_angle for a in found if a.mean_angle is not None], (0.0, 180.0))
        similar = mean_interval([a.neighbour_similarity for a in found if a.neighbour_similarity is not None],
                                (-1.0, 1.0))
        rows.append(AnatomyRow(depth=depth, members=len(found), redundant_share=share[0], redundant_share_ci=share[1],
                               mean_angle=angle[0], mean_angle_ci=angle[1], neighbour_similarity=similar[0],
                               neighbour_similarity_ci=similar[1]))
    return rows
