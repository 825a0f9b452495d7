"""The console's keys: one table (ACTIONS) drives the console screen's bindings and footer, the help
screen and the command palette, so a key is declared once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from textual.app import SystemCommand
from textual.screen import Screen

from tui.screens.help import HelpScreen

# (key, action, title, description): one table drives the console's bindings, the help screen and the
# palette. Help, compare and quit are the app's (they work on every screen); the keys that need nothing
# from the screen are bound to the app's actions (ROUTED); the others are this screen's.
ACTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("f1,h", "help", "Help", "every key and what it does"),
    ("f2", "show_tab('layers')", "Layers tab", "the layer map and the selected layer's detail"),
    ("f3", "show_tab('recovery')", "Recovery tab", "noise injection and live recovery curves"),
    ("f4", "show_tab('growth')", "Growth tab", "the growth timeline and loss curves"),
    ("f5", "show_tab('prompt')", "Prompt tab", "generate text with two models side by side"),
    ("f6", "show_tab('analyses')", "Analyses tab", "weight statistics, angle profiles, scaling fit"),
    ("f7", "show_tab('log')", "Log tab", "messages from jobs and the console"),
    ("w", "toggle_layout", "Dashboard / tabs", "all four panels at once, or one tab at a time"),
    ("a", "compute_map", "Compute layer map", "ablate every layer in the console (thread worker)"),
    ("b", "map_job", "Layer map as a job", "run the ablation map as its own process"),
    ("d", "detail", "Layer detail", "everything the session knows about the selected layer"),
    ("i", "inject", "Inject noise", "noise the selected layer and watch it recover (own process)"),
    ("c", "cancel", "Cancel job", "cancel the running job of this tab"),
    ("g", "growth", "Start growth run", "a tiny growth run against its uniform baseline (own process)"),
    ("x", "toggle_modified", "Mark layer", "mark or unmark the selected layer in the prompt pane's modified model "
     "(replaced by its neighbours' mean; noised in the noised model)"),
    ("t", "toggle_block('attention')", "Mark attention block", "mark or unmark the selected layer's attention "
     "block in the modified model (removed: its output zero, the residual passes by)"),
    ("m", "toggle_block('mlp')", "Mark MLP block", "mark or unmark the selected layer's MLP block in the modified "
     "model (removed: its output zero, the residual passes by)"),
    ("o", "older_log", "Older log lines", "the Log tab: the page before the lines shown, read from the event log"),
    ("n", "newer_log", "Newer log lines", "the Log tab: the page after the lines shown, then the live lines"),
    ("f9,s", "stop_generation", "Stop generation", "stop the text being generated"),
    ("r", "resume_job", "Resume interrupted job", "restart an interrupted job from its checkpoint"),
    ("f8", "save_figure", "Save figure", "the publication figure of the panel in view (PNG, SVG) in the session's "
     "figures/ folder"),
    ("k", "compare", "Compare view", "this session beside the others on relative depth (an atlas session: its "
     "measures live, then its models), criteria agreement"),
    ("q,ctrl+q", "quit", "Quit", "quit (jobs in their own process keep running)"),
)
# the footer's keys, each with a word short enough that all of them fit in 80 columns (help lists the titles)
FOOTER = {"help": "Help", "compute_map": "Map", "detail": "Detail", "inject": "Inject", "cancel": "Cancel",
          "growth": "Growth", "quit": "Quit"}  # fmt: skip
APP_ACTIONS = ("help", "quit", "compare")
ROUTED = ("compute_map", "map_job", "resume_job", "stop_generation")  # the console's keys the app answers


def binding_action(action: str) -> str:
    """`action` as the console screen (or the palette) runs it: the app's, or the screen's own."""
    return f"app.{action}" if action in APP_ACTIONS + ROUTED else action


def palette(screen: Screen, run_action: Callable[..., object]) -> Iterator[SystemCommand]:
    """The command palette's entry for each of the console's actions (quit is Textual's own)."""
    for _, action, title, text in ACTIONS:
        if action != "quit":
            yield SystemCommand(title, text, partial(run_action, binding_action(action), screen))


def help_screen() -> HelpScreen:
    """Every key of the console and what it does."""
    return HelpScreen([(key.replace(",", " / "), f"{title}: {text}") for key, _, title, text in ACTIONS])
