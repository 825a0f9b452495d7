"""Class colours that read on 256-colour terminals (each is an xterm-256 palette entry), and the
words that carry the same meaning where colour is off (NO_COLOR)."""

from __future__ import annotations

CLASS_COLOURS = {
    "critical": "#d70000",  # xterm 160
    "important": "#ff8700",  # xterm 208
    "minor": "#d7af00",  # xterm 178
    "redundant": "#5faf5f",  # xterm 71
    "anti": "#5f87ff",  # xterm 69
}


def class_style(name: str) -> str:
    colour = CLASS_COLOURS.get(name)
    return f"bold {colour}" if colour else "dim"
