"""Test stand-in for a chat webhook: appends every POST body to a file (one JSON per line).

Runs on the monitoring head of the monitoring scenario, on 127.0.0.1 only.
Usage: webhook_sink.py PORT FILE
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path


class Sink(BaseHTTPRequestHandler):
    out = Path("/dev/null")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.out.open("a") as fh:
            fh.write(json.dumps(json.loads(body)) + "\n")
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


if __name__ == "__main__":
    Sink.out = Path(sys.argv[2])
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
