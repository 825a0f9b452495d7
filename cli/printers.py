"""How `anatomy-tui run` prints a result: the experiment's view (tui/views/<command>.py
`print_result`) and the line saying how its perplexity was measured (its `protocol`), or the
document as JSON for an experiment without one."""

from __future__ import annotations

import json
from typing import Any

from tui.views import view


def print_result(experiment: str, doc: dict[str, Any]) -> None:
    """The view's printout, then how its perplexity was measured (a result that records it)."""
    printer = getattr(view(experiment), "print_result", None)
    if printer is None:
        print(json.dumps(doc, indent=2))
        return
    printer(doc)
    from engine.data.eval_data import describe, is_eval_protocol

    if is_eval_protocol(doc.get("protocol")):
        print(describe(doc["protocol"]))
