"""The console screen: status line, then the panels as tabs (Layers, Recovery, Growth, Prompt,
Analyses, Log). Wide terminals show the layer detail and the recovery form beside their panels.

It owns its forms and the console's keys: what a key needs (the selected layer, the form's values)
goes up to the app as a request (tui/messages.py), read and checked here on the UI thread; keys that
need nothing from the screen are bound to the app's actions. What needs only the session state (the
selection, a tab coming into view, the layer detail) is answered here; the app calls down to redraw
the panels from the state."""

from __future__ import annotations

import logging
import shlex
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, Tab, Tabs

from engine.core.untrusted import printable
from engine.registry import BY_NAME
from tui.console_settings import ConsoleSettings
from tui.console_view import ConsoleView
from tui.marks import NO_MARKS, Marks
from tui.messages import (
    CancelRequested,
    ConsolePainted,
    ConsoleReady,
    FigureRequested,
    GenerateRequested,
    GrowthPreviewRequested,
    GrowthRequested,
    InjectRequested,
    LogPageRequested,
    MarkRequested,
    Notice,
    TextGenerated,
    ViewChanged,
)
from tui.screens.console_keys import ACTIONS, FOOTER, binding_action
from tui.screens.layer_detail import LayerDetailScreen
from tui.state import Dirty, JobView, SessionState, job_progress
from tui.widgets.layer_detail import LayerDetail
from tui.widgets.layer_map import LayerMap
from tui.widgets.prompt_column import PromptColumn
from tui.widgets.status_line import StatusLine

if TYPE_CHECKING:
    from textual.widgets import RichLog

    from engine.experiments.ablation.vocabulary import AblationMap

log = logging.getLogger("anatomy_tui.console")
TABS = ("layers", "recovery", "growth", "prompt", "analyses", "log")
JOB_OF_TAB = {"layers": "ablation", "recovery": "recovery", "growth": "growth"}  # what c cancels there
FIGURES_OF_TAB = {"layers": ("ablation",), "recovery": ("recovery",), "growth": ("growth",)}  # what F8 saves there
REDRAW_ON_SHOW = {"recovery": frozenset({Dirty.RECOVERY}), "growth": frozenset({Dirty.GROWTH})}  # sized as shown
RECOVERY_FORM = ("sigma", "steps", "lr")  # the recovery form's fields, RecoverySettings' own defaults in them
FORMS = (*RECOVERY_FORM, "growth-flags", "prompt-input")  # every form field, kept in the console's view


@dataclass(frozen=True)
class PanelData:
    """What the panels and the status line are drawn from, handed down by the app."""

    state: SessionState
    n_layers: int
    session_name: str
    model_status: str = ""
    jobs: list[tuple[JobView, str]] = field(default_factory=list)  # the running jobs, each with where it runs
    marked: Marks = NO_MARKS  # the layers (x) and blocks (t, m) marked for the prompt pane's modified model


PANELS = ("layers", "recovery", "growth", "prompt")  # the dashboard's four, in reading order


TITLES = {"layers": "Layer map", "recovery": "Recovery", "growth": "Growth", "prompt": "Prompt",
          "analyses": "Analyses", "log": "Log"}  # fmt: skip


def map_job_line(jobs: list[tuple[JobView, str]], shown: AblationMap | None = None) -> str:
    """The layer map's own line of its running map: how far (a streamed map's wavefront: the layer it
    reads, the bytes read and the rate), and `cancelling` once asked to stop; with none running, a
    partial map (a stopped run's) says so and how to complete it."""
    for job, where in jobs:
        if job.experiment == "ablation":
            state = "cancelling" if job.cancelling else f"{job_progress(job) or 'starting'} · c cancels"
            return f"map {where}: {state}"
    if shown is not None and shown.partial is True:
        return f"{shown.partial_text()} · a completes it"
    return ""


class ConsoleScreen(Screen[None]):
    """One widget tree for both layouts: CSS shows one pane at a time (tabs) or the four panels in
    a grid (the `-dashboard` class), so switching never rebuilds a widget: the selection, the forms
    and the plots survive. In the dashboard, Analyses and Log open over the grid."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    # quit's ctrl+q leads the footer, as Textual's own ctrl+q does on every other screen
    BINDINGS = [
        Binding("ctrl+q", "app.quit", "Quit"),
        *(Binding(key, binding_action(action), FOOTER.get(action, title), show=action in FOOTER)
          for key, action, title, _ in ACTIONS),
    ]

    def __init__(self, settings: ConsoleSettings | None = None, state: SessionState | None = None,
                 view: ConsoleView | None = None) -> None:
        super().__init__()
        self.settings = settings or ConsoleSettings()
        self.session_state = state or SessionState()  # the lab's, read here and marked for redraws
        self.restored = view or ConsoleView()  # where the console was in this session: layer, tab, forms
        self.current = "layers"
        self.log_back = 0  # the Log tab's page: 0 live, k the k-th page back from the log's end

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield Tabs(*(Tab(TITLES[tab] if tab != "layers" else "Layers", id=f"tab-{tab}") for tab in TABS), id="tabs")
        with Container(id="panes"):
            with Horizontal(id="layers", classes="pane panel -active"):
                yield LayerMap(id="map")
                yield LayerDetail(id="detail")
            # filled just after the first paint (build_panes): out of view in the tabs, frames in the dashboard
            yield Horizontal(id="recovery", classes="pane panel")
            yield Horizontal(id="growth", classes="pane panel")
            yield Vertical(id="prompt", classes="pane panel")
            yield VerticalScroll(id="analyses", classes="pane overlay")
            yield Vertical(id="log", classes="pane overlay")
        yield Footer()

    built = False  # set once every pane is built: until then the app neither draws on it nor asks it anything

    def on_mount(self) -> None:
        for tab in TABS:
            self.query_one(f"#{tab}").border_title = TITLES[tab]
        self.apply_layout(self.size.width, self.size.height)
        self.query_one(LayerMap).focus()
        self.call_after_refresh(self.build_panes)

    async def build_panes(self) -> None:
        """After the first paint: the other panes' widgets (tui/screens/console_panes.py), then the
        console as it was left (its tab and forms), then the app hears that the console is ready."""
        self.post_message(ConsolePainted(time.perf_counter()))
        from tui.screens import console_panes  # here, not above: its modules are not needed to paint

        for pane, children in console_panes.pane_children().items():
            await self.query_one(f"#{pane}").mount_all(children)
        self.built = True
        self.restore(self.restored)
        self.post_message(ConsoleReady())

    def restore(self, view: ConsoleView) -> None:
        """Back where the console was: the forms' text, the tab, and the layer once the map has it."""
        for name, value in view.forms.items():
            if name in FORMS:
                self.query_one(f"#{name}", Input).value = value
        self.query_one(LayerMap).restore_row = view.layer
        if view.tab in TABS:
            self.show_tab(view.tab)

    def view(self) -> ConsoleView:
        """Where the console is now (a layer still to be restored counts as selected)."""
        layer = self.selected_layer
        return ConsoleView(layer=layer if layer is not None else self.query_one(LayerMap).restore_row,
                           tab=self.current, forms={name: self.query_one(f"#{name}", Input).value for name in FORMS})

    def view_changed(self) -> None:
        if self.built:
            self.post_message(ViewChanged(self.view()))

    @on(Input.Changed)
    def form_changed(self, event: Input.Changed) -> None:
        if event.input.id in FORMS:
            self.view_changed()

    def on_resize(self, event: events.Resize) -> None:
        self.apply_layout(event.size.width, event.size.height)

    @property
    def dashboard(self) -> bool:
        return self.has_class("-dashboard")

    def apply_layout(self, columns: int, rows: int) -> None:
        """Dashboard or tabs for this size and the settings; only classes change."""
        wanted = self.settings.dashboard(columns, rows)
        if wanted != self.dashboard:
            self.set_class(wanted, "-dashboard")
            log.info("layout: %s at %dx%d", "dashboard" if wanted else "tabs", columns, rows)
        self.set_class(wanted and self.current in ("analyses", "log"), "-overlay")

    def action_toggle_layout(self) -> None:
        """Forces the other layout (key w), whatever the terminal size."""
        self.settings = replace(self.settings, layout="tabs" if self.dashboard else "dashboard")
        self.apply_layout(self.size.width, self.size.height)

    @property
    def selected_layer(self) -> int | None:
        table = self.query_one(LayerMap)
        return table.cursor_row if table.row_count else None

    # redraws, each from the state alone ------------------------------------------------------
    def redraw(self, data: PanelData, dirty: set[str]) -> None:
        """The dirty panels, then the status line (jobs or the model changed) and the log's new lines."""
        try:
            self.redraw_panels(data, dirty)
        except Exception as exc:  # a damaged or unexpected result must not take the console down
            self.post_message(Notice(f"could not draw {', '.join(sorted(dirty))}: {type(exc).__name__}: {exc}",
                                     "error"))
            log.exception("redraw failed")
        if dirty & {Dirty.JOBS, Dirty.LAYERS}:
            self.query_one(StatusLine).show(data.session_name, data.model_status, data.jobs)
            self.query_one("#layers").border_subtitle = map_job_line(data.jobs, data.state.ablation_map)
        if Dirty.LOG in dirty:
            self.write_log(data.state.take_new_log())

    def redraw_panels(self, data: PanelData, dirty: set[str]) -> None:
        from tui.screens import console_panes  # imported by build_panes, before the app draws anything

        state = data.state
        with self.app.batch_update():
            if dirty & {Dirty.LAYERS, Dirty.RECOVERY, Dirty.RESULTS, Dirty.MARKS}:
                self.query_one(LayerMap).show(state, data.n_layers, data.marked)
                self.query_one(LayerDetail).show(state, self.selected_layer)
            console_panes.redraw(self, state, dirty, self.selected_layer, self.form_steps(), data.session_name)
            if Dirty.SELECTION in dirty:
                self.query_one(LayerDetail).show(state, self.selected_layer)
            if Dirty.MARKS in dirty:
                for column in self.query(PromptColumn):
                    column.mark(data.marked)

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        if event.tab is not None and event.tab.id:
            self._switch(event.tab.id.removeprefix("tab-"))

    def _switch(self, tab: str) -> None:
        """Shows `tab`'s pane (tabs) or marks its panel (dashboard); focus follows, and never lands
        in a form field, so letter keys stay commands."""
        if tab == self.current:
            return
        self.current = tab
        for pane in TABS:
            self.query_one(f"#{pane}").set_class(pane == tab, "-active")
        self.set_class(self.dashboard and tab in ("analyses", "log"), "-overlay")
        log.info("panel: %s (%s)", tab, "dashboard" if self.dashboard else "tabs")
        self.view_changed()
        if tab == "layers":
            self.query_one(LayerMap).focus()
        elif tab == "prompt":
            self.query_one("#prompt-input", Input).focus()
        elif tab == "analyses":
            self.query_one("#analyses", VerticalScroll).focus()  # arrows and pgup/pgdn scroll
        elif tab == "log":
            self.log_view().focus()
        else:
            self.query_one(Tabs).focus()
        self.session_state.dirty.update(REDRAW_ON_SHOW.get(tab, frozenset()))  # drawn on the next poll
        if tab == "log" and not self.log_back:  # the live lines, drawn now
            self.session_state.take_new_log()
            self.show_log_page(0, list(self.session_state.log))

    def show_tab(self, tab: str) -> None:
        self.query_one(Tabs).active = f"tab-{tab}"
        self._switch(tab)

    def action_show_tab(self, tab: str) -> None:
        if tab in TABS:
            self.show_tab(tab)

    @property
    def active_tab(self) -> str:
        return self.current

    def log_view(self) -> RichLog:
        """The Log tab's view (its class is imported with the deferred panes: RichLog's module loads
        rich's pretty-printer, which the first paint does not need)."""
        return cast("RichLog", self.query_one("#log-view"))

    def write_log(self, lines: list[tuple[str, str]]) -> None:
        """New lines for the live view, while it is in view (the state keeps the newest for when it
        comes into view: a hidden RichLog would keep every line written to it until shown). The view
        reads no markup, and a session's text has its control characters escaped (a forged event's
        escape sequence is shown, never sent to the terminal)."""
        if self.log_back or self.current != "log":
            return
        view = self.log_view()
        for level, text in lines:
            view.write(f"[{level}] {printable(text)}")

    def show_log_page(self, back: int, lines: list[tuple[str, str]]) -> None:
        """Page `back` of the Log tab (0: the live lines) in place of what it shows; a page back with
        no lines: the page shown stays, and the user hears why."""
        if back and not lines:
            self.notify("no older log lines: this is the start of the session's log")
            return
        self.log_back = 0
        self.log_view().clear()
        self.write_log(lines)
        self.log_back = back
        paging = f" · page {back} back · o older · n newer" if back else ""
        self.query_one("#log").border_title = TITLES["log"] + paging

    def action_older_log(self) -> None:
        self.show_tab("log")
        self.post_message(LogPageRequested(self.log_back + 1))

    def action_newer_log(self) -> None:
        if self.log_back:
            self.post_message(LogPageRequested(self.log_back - 1))

    # the keys and the forms: requests up to the app -------------------------------------------
    def action_detail(self) -> None:
        """Everything the session knows about the selected layer."""
        self.app.push_screen(LayerDetailScreen(self.session_state, self.selected_layer))

    @on(LayerMap.RowHighlighted, "#map")
    def layer_highlighted(self) -> None:
        self.session_state.dirty.add(Dirty.SELECTION)  # drawn on the next poll, with whatever else changed
        self.view_changed()

    @on(LayerMap.RowSelected, "#map")
    def layer_chosen(self) -> None:
        self.action_detail()

    def action_toggle_modified(self) -> None:
        if self.selected_layer is not None:
            self.post_message(MarkRequested(self.selected_layer))

    def action_toggle_block(self, part: str) -> None:
        if self.selected_layer is not None:
            self.post_message(MarkRequested(self.selected_layer, part))

    def action_save_figure(self) -> None:
        """Saves the figure of the panel in view (the Analyses pane: of every analysis it shows)."""
        if self.current == "analyses":
            from tui.screens.console_panes import analysis_figures  # built with the pane, after the first paint

            names = analysis_figures()
        else:
            names = FIGURES_OF_TAB.get(self.current, ())
        if not names:
            self.notify(f"the {TITLES[self.current]} panel has no figure; F8 saves the layer map's, recovery's, "
                        "growth's and the analyses'")
            return
        self.post_message(FigureRequested(names))

    async def action_cancel(self) -> None:
        """Cancels the running jobs of the panel in view (the layer map's, recovery's or growth's);
        in the prompt pane, the generation (as its own key does)."""
        if self.current == "prompt":
            await self.run_action(binding_action("stop_generation"))
        elif self.current in JOB_OF_TAB:
            self.post_message(CancelRequested(JOB_OF_TAB[self.current]))
        else:
            self.post_message(Notice("open the tab of the job to cancel (Layers, Recovery or Growth) and press c"))

    def action_inject(self) -> None:
        """InjectRequested for the selected layer with the recovery form's numbers."""
        if self.selected_layer is None:
            self.post_message(Notice("select a layer first (Layers tab, arrows)", "warning"))
            return
        values: dict[str, float] = {}
        for name in RECOVERY_FORM:
            raw = self.query_one(f"#{name}", Input).value.strip()
            if name == "steps" and raw == "auto":  # sized for the device by the run
                continue
            try:
                values[name] = int(raw) if name == "steps" else float(raw)
            except ValueError:
                self.post_message(Notice(f"{name} must be a number{' or auto' * (name == 'steps')}, not {raw!r}",
                                         "error"))
                return
        steps = int(values["steps"]) if "steps" in values else None
        self.post_message(InjectRequested(self.selected_layer, values["sigma"], steps, values["lr"]))

    def growth_flags(self) -> tuple[str, ...]:
        """The growth form's flags, split like a shell would; ValueError if they do not parse."""
        return tuple(shlex.split(self.query_one("#growth-flags", Input).value))

    def action_growth(self) -> None:
        """GrowthRequested with the growth form's flags."""
        try:
            flags = self.growth_flags()
        except ValueError as exc:
            self.post_message(Notice(f"growth flags: {exc}", "error"))
            return
        self.post_message(GrowthRequested(flags))

    def ask_growth_preview(self) -> None:
        """GrowthPreviewRequested with the growth form's flags (the app asks once the model is settled);
        nothing while they do not parse."""
        try:
            flags = self.growth_flags()
        except ValueError:
            return
        self.post_message(GrowthPreviewRequested(flags))

    @on(Input.Submitted, "#prompt-input")
    def request_generation(self, event: Input.Submitted) -> None:
        """GenerateRequested with each column's model and the noise sigma as they are now."""
        event.stop()
        if event.value.strip():
            columns = {str(column.id): column.model_choice for column in self.query(PromptColumn)}
            self.post_message(GenerateRequested(event.value, columns, self.noise_sigma()))

    def form_steps(self) -> int | None:
        """The recovery form's step budget, if it holds a positive whole number."""
        try:
            steps = int(self.query_one("#steps", Input).value)
        except ValueError:
            return None
        return steps if steps > 0 else None

    def noise_sigma(self) -> float:
        """The recovery form's sigma; recovery's default while the form holds no usable number."""
        default = float(BY_NAME["recovery"].default_texts()["sigma"])
        try:
            value = float(self.query_one("#sigma", Input).value)
        except ValueError:
            return default
        return value if value > 0 else default

    # the prompt pane: its generation's worker posts here ------------------------------------------
    generation = 0  # the generation whose text the prompt columns show

    def begin_generation(self, prompt: str, run: int) -> None:
        self.generation = run
        for column in self.query(PromptColumn):
            column.begin(prompt)

    @on(TextGenerated)
    def show_generated(self, message: TextGenerated) -> None:
        """A column's text so far, from the newest generation only (an older one's last words are late)."""
        if message.run == self.generation:
            for found in self.query(f"#{message.column}").results(PromptColumn):
                found.show(message.text, message.note)
