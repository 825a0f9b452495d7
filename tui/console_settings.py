"""The console's own settings, in one typed place: when the dashboard layout takes over from the
tabs, whether a new session starts its layer map by itself, and where its jobs run."""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("auto", "dashboard", "tabs")


@dataclass(frozen=True)
class ConsoleSettings:
    """`layout` 'auto' shows the dashboard (four panels at once) from `dashboard_columns` x
    `dashboard_rows` cells up and the tabs below; 'dashboard' and 'tabs' force one (key w toggles).
    `auto_map`: a session without a layer map starts computing one as soon as the model is loaded.
    `cluster`: the console's jobs start as Ray tasks there (`anatomy-tui run ... --cluster`: local
    or auto), their events written into the session as they arrive; None: on this
    machine."""

    layout: str = "auto"
    dashboard_columns: int = 160
    dashboard_rows: int = 45
    auto_map: bool = True
    cluster: str | None = None

    def dashboard(self, columns: int, rows: int) -> bool:
        """Whether a terminal of this size shows the dashboard."""
        if self.layout == "auto":
            return columns >= self.dashboard_columns and rows >= self.dashboard_rows
        return self.layout == "dashboard"
