"""The depth-family result as `anatomy-tui run depth-family` prints it: the members' table (final
held-out loss and anatomy summary), the fitted depth term beside paper B's and the toy's exponents,
and the anatomy against depth. A minimal printer; the console's panels are the view's to add."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from engine.experiments.depth_family.vocabulary import DepthFamilyResult
from tui.views._format import fmt, interval
from tui.views._tables import WholeConsole


def members_table(result: DepthFamilyResult) -> Table:
    """One row per member: its cell, N, final held-out loss and anatomy summary."""
    table = Table(title="depth family: members (final held-out loss, anatomy on the held-out windows)")
    for column in ("member", "depth", "width", "tokens", "seed", "N", "held-out loss", "redundant",
                   "mean angle", "neighbour sim."):
        table.add_column(column, justify="left" if column == "member" else "right")
    for m in result.members:
        a = m.anatomy
        table.add_row(m.name, str(m.depth), str(m.width), str(m.tokens), str(m.seed), str(m.params),
                      fmt(m.heldout_loss, ".4f"), fmt(a.redundant_share if a else None, ".2f"),
                      fmt(a.mean_angle if a else None, ".1f"), fmt(a.neighbour_similarity if a else None, ".3f"))
    return table


def fit_lines(result: DepthFamilyResult) -> list[str]:
    """The fitted depth term, its checks, and the references beside it."""
    fit = result.fit
    if fit is None:
        return ["no exponent fitted (fewer than three depths finished)"]
    lines = [f"L = c_l / l^a_l + L0 at width {fit.width}, {fit.tokens} tokens: a_l = {fit.alpha_l:.2f} "
             f"{interval(fit.ci95, '.2f')} (bootstrap, {fit.bootstrap_valid} draws), c_l = {fit.c_l:.4g}, "
             f"L0 = {fit.L0:.4g}",
             f"leave-one-depth-out RMSE {fmt(fit.loo_rmse, '.4f')}; objective within 0.3 % of its best for a_l in "
             f"[{fit.flat_range[0]:.2f}, {fit.flat_range[1]:.2f}]"
             f"{': weakly identified' if fit.weakly_identified else ''}"]
    lines += [f"  beside: {ref.name}: a_l = {ref.alpha_l:g} {interval(ref.interval, '.1f') if ref.interval else ''}"
              for ref in fit.references]
    return lines


def anatomy_table(result: DepthFamilyResult) -> Table:
    """Per depth: the anatomy summaries' means with their 95 % intervals over members."""
    table = Table(title="anatomy against depth (mean over members, 95% interval)")
    for column in ("depth", "members", "redundant share", "mean angle", "neighbour similarity"):
        table.add_column(column, justify="right")
    for row in result.anatomy_by_depth:
        table.add_row(str(row.depth), str(row.members),
                      f"{fmt(row.redundant_share, '.2f')} {interval(row.redundant_share_ci, '.2f')}",
                      f"{fmt(row.mean_angle, '.1f')} {interval(row.mean_angle_ci, '.1f')}",
                      f"{fmt(row.neighbour_similarity, '.3f')} {interval(row.neighbour_similarity_ci, '.3f')}")
    return table


def print_result(doc: dict[str, Any]) -> None:
    result = DepthFamilyResult.from_json(doc)
    console = WholeConsole()
    console.print(members_table(result))
    for line in fit_lines(result):
        console.print(line, highlight=False)
    if result.anatomy_by_depth:
        console.print(anatomy_table(result))
    if result.csv:
        console.print(f"CSV (scaling-fit's columns): {result.csv}", highlight=False)
