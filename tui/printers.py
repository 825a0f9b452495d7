"""How `anatomy-tui run` prints a result: the experiment's view (tui/views/<command>.py
`print_result`), or the document as JSON for an experiment without one."""

from __future__ import annotations

import json
from typing import Any

from tui.views import view


def print_result(experiment: str, doc: dict[str, Any]) -> None:
    printer = getattr(view(experiment), "print_result", None)
    if printer is None:
        print(json.dumps(doc, indent=2))
    else:
        printer(doc)
