"""A local stand-in for the Hub endpoints `HfApi.create_repo` and `upload_folder` call, so pushing
is tested without the network: repos/create, validate-yaml (a README's metadata, parsed here by
`ModelCard`), preupload (every file a regular git blob, so no LFS or Xet transfer) and commit
(ndjson: a header line, then each file base64-encoded), which stores the files under
`root/<repo id>/`."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from huggingface_hub import ModelCard


@dataclass
class StandIn:
    endpoint: str
    root: Path
    created: list[dict] = field(default_factory=list)  # the repos/create payloads
    tokens: set[str] = field(default_factory=set)  # the bearer tokens requests carried
    commits: list[str] = field(default_factory=list)  # commit summaries


@contextmanager
def hub_stand_in(root: Path) -> Iterator[StandIn]:
    state = StandIn("", root)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _answer(self, status: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.tokens.add(self.headers.get("Authorization", "").removeprefix("Bearer "))
            path = self.path.split("?")[0]
            if path == "/api/repos/create":
                doc = json.loads(data)
                state.created.append(doc)
                repo = f"{doc['organization']}/{doc['name']}" if doc.get("organization") else doc["name"]
                return self._answer(200, {"url": f"{state.endpoint}/{repo}"})
            if path == "/api/validate-yaml":  # upload_folder checks a README's metadata first
                try:
                    ModelCard(json.loads(data)["content"])
                except ValueError as exc:
                    return self._answer(400, {"errors": [{"message": str(exc)}]})
                return self._answer(200, {"errors": [], "warnings": []})
            parts = path.split("/")  # /api/models/<org>/<name>/<preupload|commit>/<revision>
            if len(parts) == 7 and parts[:3] == ["", "api", "models"]:
                repo, action = f"{parts[3]}/{parts[4]}", parts[5]
                if action == "preupload":
                    files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                             for f in json.loads(data)["files"]]
                    return self._answer(200, {"files": files})
                if action == "commit":
                    for line in data.splitlines():
                        item = json.loads(line)
                        if item["key"] == "header":
                            state.commits.append(item["value"]["summary"])
                        elif item["key"] == "file":
                            target = state.root / repo / item["value"]["path"]
                            target.parent.mkdir(parents=True, exist_ok=True)
                            target.write_bytes(base64.b64decode(item["value"]["content"]))
                        else:
                            return self._answer(400, {"error": f"the stand-in takes no {item['key']}"})
                    return self._answer(200, {"commitUrl": f"{state.endpoint}/{repo}/commit/{'0' * 40}",
                                              "commitOid": "0" * 40, "pullRequestUrl": None})
            return self._answer(404, {"error": f"the stand-in has no {path}"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
