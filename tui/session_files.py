"""The parts of a session folder only the console reads and writes, named once (the store's own
parts, which every front end and the experiments share: engine/disk/session_layout.py). Each is read
and written through `Session.part`, which refuses a link on the way; a session with a link anywhere
in its folder does not open (sessions/store.py).

    <session>/EVENT_INDEX     which lines of the event log the console's panels depend on (tui/event_index.py)
              APP_LOG         the console's log file
              CONSOLE_VIEW    where the console was: its selected layer, tab and forms (tui/console_view.py)
              FIGURES/        figures the console saved (its key F8: the panel in view's)
"""

from __future__ import annotations

EVENT_INDEX = "events.index.json"
APP_LOG = "app.log"
CONSOLE_VIEW = "console.json"
FIGURES = "figures"
