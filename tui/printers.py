"""How `anatomy-tui run` prints each experiment's result: one function per experiment name, a plain
JSON dump for the rest. Rich renderables only (no Textual), so the console's result view shows the
same tables (`weights_view`, `manipulate_view`, ...)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from engine.events import ManipulateRow, from_doc
from tui.palette import class_style

SAMPLE_WIDTH = 70


def fmt(value: Any, spec: str = ".3f", missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def print_ablation(doc: dict[str, Any]) -> None:
    table = Table(title=f"{doc['model']}  baseline PPL {doc['baseline_ppl']:.2f}  ({doc['method']})")
    for column in ("layer", "PPL", "D %", "95% CI", "class", "BI", "ang"):
        table.add_column(column, justify="right")
    for row in doc["layers"]:
        ci = "" if row["ci_low"] is None else f"[{row['ci_low']:.1f}, {row['ci_high']:.1f}]"
        label = row["layer_class"] + (" anti" if row["anti"] else " anti?" if row["anti_within_noise"] else "")
        table.add_row(str(row["layer"]), f"{row['ppl']:.2f}", f"{row['degradation_pct']:.1f}", ci, label,
                      f"{row['block_influence']:.3f}", f"{row['angular_distance']:.3f}")
    Console().print(table)
    rho = doc["spearman"]
    print(f"Spearman vs D: block influence {rho['block_influence']}, angular distance {rho['angular_distance']}")


def _steps(value: int | None) -> str:
    return "never" if value is None else str(value)


def print_recovery(doc: dict[str, Any]) -> None:
    settings = doc["settings"]
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
        title=f"{doc['model']}  baseline PPL {doc['baseline_ppl']:.2f}  sigma {settings['sigma']}  "
        f"{settings['steps']} steps  lr {settings['lr']}"
    )  # fmt: skip
    columns = ("layer", "status", "noised", "<2x", "<1.5x", "<1.1x", "best", "final", "x base", "better")
    for column in columns:
        table.add_column(column, justify="right")
    for row in doc["layers"]:
        steps = row["steps_to"]
        table.add_row(
            str(row["layer"]), row["status"], fmt(row["ppl_after_noise"], ".1f", "-"),
            _steps(steps["2.0"]), _steps(steps["1.5"]), _steps(steps["1.1"]),
            fmt(row["best_ppl"], ".2f", "-"), fmt(row["final_ppl"], ".2f", "-"),
            fmt(row["final_ratio"], ".2f", "-"), "yes" if row["improved_over_baseline"] else "no",
        )  # fmt: skip
    console = Console()
    console.print(table)
    budget = doc["budget"]
    console.print(f"hardest first: {', '.join(map(str, doc['ranking']))}", highlight=False)
    console.print(f"Spearman(difficulty, ablation D): {doc['spearman_vs_ablation']}", highlight=False)
    console.print(
        f"budget: uniform {budget['uniform_total']} steps, by difficulty {budget['proposed_total']} "
        f"(saves {budget['saving_pct']:.0f}%)", highlight=False,
    )  # fmt: skip


def print_growth(doc: dict[str, Any]) -> None:
    """The comparison, the budget table and the generations side by side."""
    console = Console()
    params = doc["params"]
    console.print(
        f"parameters: growth {params['growth']:,}  uniform {params['uniform']:,} "
        f"({100 * (params['uniform'] / params['growth'] - 1):+.3f} %)", highlight=False,
    )  # fmt: skip
    arms = Table(title=f"growth vs uniform, preset {doc['preset']}")
    for column in ("arm", "steps", "val loss mean", "sd", "seeds", "train s", "tokens/s"):
        arms.add_column(column, justify="right" if column != "arm" else "left")
    for name, arm in doc["arms"].items():
        arms.add_row(
            name, str(arm["steps"]), f"{arm['mean']:.4f}", f"{arm['sd']:.4f}", str(len(arm["val_loss"])),
            f"{arm['seconds']:.1f}", f"{arm['tokens_per_s']:,.0f}",
        )  # fmt: skip
    console.print(arms)
    budget = Table(title="effective steps (epochs) per layer")
    budget.add_column("layer")
    budget.add_column("class")
    for name in doc["arms"]:
        budget.add_column(name, justify="right")
    for row in doc["budget_table"]:
        cells = [f"{row['steps'][a]} ({row['epochs'][a]:.2f})" for a in doc["arms"]]
        budget.add_row(str(row["layer"]), row["layer_class"], *cells)
    console.print(budget)
    gens = Table(title="greedy generations", show_lines=True)
    gens.add_column("prompt")
    for name in doc["arms"]:
        gens.add_column(name)
    for row in doc["generations"]:
        gens.add_row(row["prompt"], *(repr(row[a])[1:-1] for a in doc["arms"]))
    console.print(gens)
    ratio = doc.get("ratio_uniform_over_growth_seconds")
    if ratio is not None:
        g, u = doc["arms"]["growth_100"]["mean"], doc["arms"]["uniform_100"]["mean"]
        console.print(
            f"growth_100 vs uniform_100: val loss {g:.4f} vs {u:.4f} ({u / g:.2f}x), uniform/growth seconds "
            f"{ratio:.2f}; the paper: 0.127 vs 0.599 (4.7x), 59.6 s / 52.0 s = 1.15", highlight=False,
        )  # fmt: skip


def _spread(q: dict[str, Any]) -> str:
    """'median [q1-q3]', short enough for an 80-column table."""
    return "" if q["median"] is None else f"{q['median']:.1f} [{q['q1']:.0f}-{q['q3']:.0f}]"


def print_dynamics(doc: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=Text(f"{doc['model']}  {doc['tokens']} tokens, first position {doc['first_token']}  "
                             "(degrees: median [q1-q3])"))
    columns = ["layer", "theta(h, h')", "theta(dh, dh')", "|h'|", "|dh|/|h|"]
    lens = doc.get("logit_lens")
    if lens:
        columns.append("lens loss")
    for column in columns:
        table.add_column(column, justify="right")
    for row in doc["layers"]:
        cells = [
            str(row["layer"]),
            _spread(row["angle_state"]),
            _spread(row["angle_update"]),
            fmt(row["norm"]["median"], ".1f", ""),
            f"{row['relative_update']['median']:.3f}",
        ]
        if lens:
            cells.append(f"{row['lens_loss']:.3f}")
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)
    core = doc["core"]
    console.print(f"core layers {core['layers'][0]}-{core['layers'][1]}: median theta(dh, dh') "
                  f"{fmt(core['angle_update_median'], '.1f', '')} deg, "
                  f"theta(h, h') {fmt(core['angle_state_median'], '.1f', '')} deg, "
                  f"|dh|/|h| {core['relative_update_median']:.3f}", highlight=False)
    pca = doc["pca"]
    explained = ", ".join(f"{x:.3f}" for x in pca["explained"][:5])
    console.print(f"PCA explained variance: {explained}; k={pca['k']} ({pca['k_choice']}); "
                  f"bulk fraction {pca['bulk_fraction']:.4f} (paper: 0.996)", highlight=False)
    for cluster in pca["clusters"]:
        top = ", ".join(f"{word!r}x{count}" for word, count in cluster["top_tokens"])
        console.print(f"cluster {cluster['label']}{' (bulk)' if cluster['bulk'] else ''}: "
                      f"{cluster['size']} tokens ({cluster['fraction']:.4f}), top: {top}",
                      markup=False, highlight=False)
        for example in cluster["examples"]:
            console.print(f"    {example}", markup=False, highlight=False)


def _interval(pair: Any, spec: str = ".3f") -> str:
    """[low, high], a missing side "open"; "n/a" when there is no interval."""
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        return "n/a"
    return "[" + ", ".join(fmt(v, spec, "open") for v in pair) + "]"


def scaling_fit_view(doc: dict[str, Any]) -> Group:
    """The fit's terms (exponent, bootstrap interval, coefficient), then its a_l profile interval,
    objective and errors. Read defensively: the console shows it for any session's file."""
    params, ci95 = doc.get("params") or {}, doc.get("ci95") or {}
    heading = Text(f"L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 fitted to {doc.get('n_points', '?')} runs "
                   f"({doc.get('optimizer', 'lm')}, {doc.get('loss_function', 'least_squares')})", style="italic")
    table = Table()
    for column in ("term", "exponent", "95% (bootstrap)", "coefficient"):
        table.add_column(column, justify="left" if column == "term" else "right")
    for term, key in (("width m", "m"), ("depth l", "l"), ("tokens D", "D")):
        table.add_row(f"{term} (alpha_{key}, c_{key})", fmt(params.get(f"alpha_{key}")),
                      _interval(ci95.get(f"alpha_{key}")), fmt(params.get(f"c_{key}"), ".4g"))
    table.add_row("floor L0", "", _interval(ci95.get("L0")), fmt(params.get("L0"), ".4g"))
    lines: list[Any] = [heading, table]
    if "alpha_l_profile_ci95" in doc:
        lines.append(Text(f"a_l profile-likelihood 95% {_interval(doc['alpha_l_profile_ci95'])}"))
    lines.append(Text(f"objective {fmt(doc.get('objective'), '.6g')} (mean squared log residual) · train RMSE "
                      f"{fmt(doc.get('train_rmse'), '.4g')} · held-out RMSE {fmt(doc.get('heldout_rmse'), '.4g')}"))
    return Group(*lines)


def print_scaling_fit(doc: dict[str, Any]) -> None:
    Console().print(scaling_fit_view(doc))


def toy_depth_view(doc: dict[str, Any]) -> Table:
    """One row per regime: the fitted a_l with its interval, then the held-out loss at each depth."""
    regimes = doc.get("regimes") or {}
    depths = sorted({d for fit in regimes.values() for d in fit.get("depths", [])})
    table = Table(title=f"{doc.get('fit', 'L = c / l^alpha_l')}  (preset {doc.get('preset', '?')}, "
                        f"temperature {doc.get('temperature', '?')}): held-out loss by student depth")
    for column in ("regime", "a_l", "95% CI", *(f"l={d}" for d in depths)):
        table.add_column(column, justify="left" if column == "regime" else "right")
    for regime, fit in regimes.items():
        loss = dict(zip(fit.get("depths", []), fit.get("loss", []), strict=True))
        table.add_row(regime, fmt(fit.get("alpha_l"), ".2f"), _interval(fit.get("ci95"), ".2f"),
                      *(fmt(loss.get(d), ".4f", "") for d in depths))
    return table


def print_toy_depth(doc: dict[str, Any]) -> None:
    Console().print(toy_depth_view(doc))


def weights_view(doc: dict[str, Any]) -> Group:
    """The weights result: predictability against the two nulls, then the R²-perplexity paradox.
    Read defensively: the console shows it for any session's file."""
    components = doc.get("components") or {}
    first, last = (doc.get("predicted_layers") or ["?", "?"])[:2]
    table = Table(title=f"{doc.get('model', '')}: predictability of layers {first}-{last} "
                        "(real / shuffled order / independent layers)")
    for column in ("component", "R² in-sample", "R² leave-one-out", "cos LOO", "delta corr mean", "delta sd",
                   "R² in / LOO, all layers"):
        table.add_column(column, justify="right")
    lines: list[Any] = [table]
    for name, comp in components.items():
        shuffled, independent = comp.get("null_shuffled") or {}, comp.get("null_independent") or {}

        def cell(key: str, comp=comp, shuffled=shuffled, independent=independent) -> str:
            return f"{fmt(comp.get(key))} / {fmt(shuffled.get(key))} / {fmt(independent.get(key))}"

        every = comp.get("all_layers") or {}
        table.add_row(name, cell("r2_in_sample"), cell("r2_loo"), cell("cosine_loo"), cell("delta_corr_mean"),
                      cell("delta_corr_sd"), f"{fmt(every.get('r2_in_sample'))} / {fmt(every.get('r2_loo'))}")
    for name, comp in components.items():
        reading = comp.get("reading") or {}
        if reading:
            lines.append(Text(f"{name}: delta correlation {reading.get('delta_corr_mean')}; "
                              f"leave-one-out R² {reading.get('r2_loo')}"))
    rows = doc.get("paradox") or []
    if rows:
        paradox = Table(title=f"R²-perplexity paradox (baseline PPL {fmt(doc.get('baseline_ppl'), '.2f')}, "
                              f"{rows[0].get('prediction')} predictions)")
        for column in ("layers replaced", "PPL", "D %", "mean R² in-sample", "mean R² LOO", "mean cos"):
            paradox.add_column(column, justify="right")
        for row in rows:
            layers = row.get("layers_replaced") or []
            label = ",".join(map(str, layers)) if len(layers) <= 9 else f"{len(layers)} layers"
            paradox.add_row(label, fmt(row.get("ppl"), ".2f", "inf"), fmt(row.get("degradation_pct"), ".1f", "inf"),
                            fmt(row.get("r2_in_sample_mean")), fmt(row.get("r2_loo_mean")),
                            fmt(row.get("cosine_mean")))
        lines.append(paradox)
    return Group(*lines)


def print_weights(doc: dict[str, Any]) -> None:
    Console().print(weights_view(doc))


def manipulate_view(doc: dict[str, Any]) -> Table:
    """results/manipulate.json as rows: layers, strategy, its parameter, ppl, D %, the sample."""
    table = Table(title=f"baseline ppl {doc['baseline_ppl']:,.2f} · sample: {doc.get('baseline_sample', '')[:60]!r}",
                  expand=False)  # fmt: skip
    for column, justify in (("layers", "left"), ("strategy", "left"), ("param", "right"), ("ppl", "right"),
                            ("D %", "right"), ("greedy sample", "left")):  # fmt: skip
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for raw in doc["results"]:
        row = from_doc(ManipulateRow, raw)
        d = row.degradation_pct
        style = class_style("anti") if d is not None and d < 0 else ""  # the edit helps: as on the map
        table.add_row(
            ",".join(map(str, row.layers)) + (" (together)" if row.together else ""),
            row.strategy,
            "" if row.param is None else f"{row.param:g}",
            "" if row.ppl is None else f"{row.ppl:,.2f}",
            Text("" if d is None else f"{d:+,.1f}", style=style),
            row.sample.replace("\n", " ")[:SAMPLE_WIDTH],
        )
    return table


def print_manipulate(doc: dict[str, Any]) -> None:
    console = Console()
    console.print(f"{doc['model']}  prompt {doc['prompt']!r}", highlight=False)
    console.print(manipulate_view(doc))
    console.print(f"baseline sample: {doc['baseline_sample']!r}", highlight=False)


def _layer_list(layers: list[int]) -> str:
    """0-3,7: runs of consecutive layers as ranges."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def prune_notes(doc: dict[str, Any]) -> list[Text]:
    """The lines under either prune table: agreement with the ppl criterion, the depth law, the export."""
    agreement = ", ".join(f"{name} {fmt(rho, '.2f')}" for name, rho in (doc.get("agreement") or {}).items())
    lines = [Text(f"Spearman with the ppl criterion: {agreement or 'n/a'}")]
    fit = doc.get("depth_fit") or {}
    if fit.get("a") is not None:
        lines.append(Text(f"depth law (exploratory): a = {fit['a']:.2f} {_interval(fit.get('ci95'), '.2f')}"))
    if doc.get("exported"):
        lines.append(Text(f"exported: {doc['exported']}"))
    return lines


def prune_view(doc: dict[str, Any]) -> Group:
    """The console's compact prune table: per number of layers removed, each criterion's perplexity
    and which layers it removed (healed perplexity beside it where healed)."""
    curve = doc.get("curve") or []
    methods = list(dict.fromkeys(str(p.get("method")) for p in curve))
    heading = Text(f"{doc.get('model', '')}  baseline PPL {fmt(doc.get('baseline_ppl'), '.2f')}: perplexity "
                   "(and the layers removed) per criterion", style="italic")
    table = Table()
    table.add_column("removed", justify="right")
    for method in methods:
        table.add_column(method, justify="right")
    cells = {(p.get("method"), p.get("removed")): p for p in curve}
    for removed in sorted({p.get("removed") for p in curve}):
        row = [str(removed)]
        for method in methods:
            point = cells.get((method, removed))
            healed = (point or {}).get("healed_ppl")
            row.append("" if point is None else f"{fmt(point.get('ppl'), '.2f', 'inf')} "
                       f"({_layer_list(point.get('layers', []))})" + ("" if healed is None else f" → {healed:.2f}"))
        table.add_row(*row)
    return Group(heading, table, *prune_notes(doc))


def print_prune(doc: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"{doc['model']}  baseline PPL {doc['baseline_ppl']:.2f}  (layers removed by each criterion)")
    for column in ("criterion", "removed", "layers", "PPL", "95% CI", "healed"):
        table.add_column(column, justify="left" if column in ("criterion", "layers") else "right")
    for row in doc["curve"]:
        ci = "" if row["ci_low"] is None else f"[{row['ci_low']:.1f}, {row['ci_high']:.1f}]"
        table.add_row(row["method"], str(row["removed"]), ",".join(map(str, row["layers"])),
                      fmt(row["ppl"], ".2f", "inf"), ci, fmt(row["healed_ppl"], ".2f", "-"))
    console.print(table)
    for line in prune_notes(doc):
        console.print(line, highlight=False)


PRINTERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "prune": print_prune,
    "ablation": print_ablation,
    "recovery": print_recovery,
    "growth": print_growth,
    "dynamics": print_dynamics,
    "scaling-fit": print_scaling_fit,
    "toy-depth": print_toy_depth,
    "weights": print_weights,
    "manipulate": print_manipulate,
}


def print_result(experiment: str, doc: dict[str, Any]) -> None:
    """The experiment's own tables, or the document as JSON for one without a printer."""
    printer = PRINTERS.get(experiment)
    if printer is None:
        print(json.dumps(doc, indent=2))
    else:
        printer(doc)
