#!/usr/bin/env python3
"""pxe-state: per-node install state behind the provisioner's PXE server.

Installed by the pxe_server role (managed by Ansible; local edits are overwritten).
Listens on 127.0.0.1 behind nginx and answers:

  GET  /boot/<node>.ipxe       the node's iPXE script: its installer while the node is
                               "armed", otherwise boot from the local disk
  POST /api/installed/<node>   the installer's late command reports "installed" (body:
                               the new system's SSH host public keys, one per line);
                               accepted only from the node's own address and only while
                               the node is armed: it flips that node, and only that node,
                               to "installed", so the next PXE boot goes to the disk
  POST /api/failed/<node>      the deploy agent reports a failed image deploy (body:
                               "<step>: <message>", one line, 2 KiB at most); same rules
                               as installed: the node goes to "failed", which boots its
                               disk (no deploy loop) and shows the step in `provision apply`
  GET  /api/status[/<node>]    JSON state for the provisioner's install lifecycle

States live in one JSON file per node in the state directory: {"state": "armed",
"expires": <unix time>} is written by Ansible (pxe_server_arm_nodes) to (re)install a
node; an armed state past its expiry, like a missing file, means "local" (boot the disk),
so a node whose install never started cannot be wiped by a PXE boot days later.
Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
KEY_RE = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com"
    r"|sk-ecdsa-sha2-nistp256@openssh\.com) ([A-Za-z0-9+/]+={0,3})(\s.*)?$"
)
MAX_BODY = 16384
MAX_KEYS = 8
STATES = ("armed", "installed", "failed", "local")
MAX_FAILURE = 2048
FAILURE_RE = re.compile(r"^([a-z]{1,20}): (\S.*)$")

LOCAL_BOOT = """#!ipxe
# {node}: installed (or not armed for installation): boot from the local disk
echo provision: {node} boots from its local disk
iseq ${{platform}} efi && exit 1 ||
sanboot --no-describe --drive 0x80 || exit 1
"""


@dataclass
class Config:
    nodes: dict[str, str | None]  # node -> address its report must come from (None: any)
    state_dir: Path
    http_root: Path
    check_source: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, path: str | Path) -> Config:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        nodes = {str(n["name"]): (str(n["address"]) if n.get("address") else None) for n in data["nodes"]}
        return cls(
            nodes=nodes,
            state_dir=Path(data["state_dir"]),
            http_root=Path(data["http_root"]),
            check_source=bool(data.get("check_source", True)),
        )


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_state(cfg: Config, node: str) -> dict[str, Any]:
    path = cfg.state_dir / f"{node}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"state": "local"}
    except (OSError, ValueError):
        return {"state": "local", "error": "unreadable state file"}
    if not isinstance(data, dict) or data.get("state") not in STATES:
        return {"state": "local", "error": "invalid state file"}
    expires = data.get("expires")
    if data["state"] == "armed" and isinstance(expires, (int, float)) and expires < time.time():
        return {"state": "local", "expired": expires}
    return data


def write_state(cfg: Config, node: str, data: dict[str, Any]) -> None:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{node}.", dir=cfg.state_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, cfg.state_dir / f"{node}.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_keys(body: str) -> list[str] | None:
    """``type base64`` for each public key line; None when a line is not a key."""
    keys: list[str] = []
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            continue
        match = KEY_RE.match(line)
        if match is None:
            return None
        key = f"{match.group(1)} {match.group(3)}"
        if key not in keys:
            keys.append(key)
    if len(keys) > MAX_KEYS:
        return None
    return keys


Reply = tuple[int, str, str]


def _json(status: int, payload: dict[str, Any]) -> Reply:
    return status, "application/json", json.dumps(payload, sort_keys=True) + "\n"


def boot_script(cfg: Config, node: str) -> Reply:
    if node not in cfg.nodes:
        return 404, "text/plain", f"unknown node {node}\n"
    state = read_state(cfg, node)
    if state["state"] == "armed":
        try:
            script = (cfg.http_root / "nodes" / node / "install.ipxe").read_text(encoding="utf-8")
        except OSError:
            return 500, "text/plain", f"{node} is armed but has no install.ipxe\n"
        return 200, "text/plain", script
    return 200, "text/plain", LOCAL_BOOT.format(node=node)


def _same_address(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


def _reporter_refused(cfg: Config, node: str, client: str) -> Reply | None:
    """Why a report for ``node`` from ``client`` is not taken (an unknown node, or a source
    address other than the node's own), or None."""
    if node not in cfg.nodes:
        return _json(404, {"error": f"unknown node {node}"})
    expected = cfg.nodes[node]
    if cfg.check_source and expected is not None and not _same_address(client, expected):
        return _json(403, {"error": f"reports for {node} must come from {expected}, not {client}"})
    return None


def report_installed(cfg: Config, node: str, client: str, body: str) -> Reply:
    refused = _reporter_refused(cfg, node, client)
    if refused is not None:
        return refused
    keys = parse_keys(body)
    if keys is None:
        return _json(400, {"error": "the body must be SSH public keys, one per line (at most 8)"})
    with cfg.lock:
        state = read_state(cfg, node)
        if state["state"] == "installed":
            return _json(200, {"node": node, **state})
        if state["state"] != "armed":
            return _json(409, {"error": f"{node} is not armed for installation (state {state['state']})"})
        new = {"state": "installed", "since": now(), "reported_from": client, "host_keys": keys}
        write_state(cfg, node, new)
    return _json(200, {"node": node, **new})


def report_failed(cfg: Config, node: str, client: str, body: str) -> Reply:
    refused = _reporter_refused(cfg, node, client)
    if refused is not None:
        return refused
    match = FAILURE_RE.match(body.strip()) if len(body) <= MAX_FAILURE and "\n" not in body.strip() else None
    if match is None:
        return _json(400, {"error": "the body must be one line: <step>: <message>"})
    with cfg.lock:
        state = read_state(cfg, node)
        if state["state"] != "armed":
            return _json(409, {"error": f"{node} is not armed for installation (state {state['state']})"})
        new = {"state": "failed", "since": now(), "reported_from": client, "step": match.group(1),
               "message": match.group(2)}
        write_state(cfg, node, new)
    return _json(200, {"node": node, **new})


def status(cfg: Config, node: str | None) -> Reply:
    if node is None:
        return _json(200, {"nodes": {n: read_state(cfg, n) for n in sorted(cfg.nodes)}})
    if node not in cfg.nodes:
        return _json(404, {"error": f"unknown node {node}"})
    return _json(200, {"node": node, **read_state(cfg, node)})


def route(cfg: Config, method: str, path: str, client: str, body: str) -> Reply:
    path = path.split("?", 1)[0]
    parts = [p for p in path.split("/") if p]
    if method == "GET" and len(parts) == 2 and parts[0] == "boot" and parts[1].endswith(".ipxe"):
        node = parts[1][: -len(".ipxe")]
        if NAME_RE.match(node):
            return boot_script(cfg, node)
    if parts[:1] == ["api"]:
        if method == "POST" and len(parts) == 3 and parts[1] == "installed" and NAME_RE.match(parts[2]):
            return report_installed(cfg, parts[2], client, body)
        if method == "POST" and len(parts) == 3 and parts[1] == "failed" and NAME_RE.match(parts[2]):
            return report_failed(cfg, parts[2], client, body)
        if method == "GET" and parts[1:] == ["status"]:
            return status(cfg, None)
        if method == "GET" and len(parts) == 3 and parts[1] == "status" and NAME_RE.match(parts[2]):
            return status(cfg, parts[2])
    return 404, "text/plain", "not found\n"


class Handler(BaseHTTPRequestHandler):
    server_version = "pxe-state/1"
    cfg: Config  # set by make_server

    def _client(self) -> str:
        peer = self.client_address[0]
        forwarded = self.headers.get("X-Real-IP")
        # Only the local nginx may say who the client is.
        if forwarded and peer in ("127.0.0.1", "::1"):
            return forwarded.strip()
        return str(peer)

    def _send(self, reply: Reply) -> None:
        status_code, ctype, text = reply
        data = text.encode("utf-8")
        self.send_response(status_code)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(route(self.cfg, "GET", self.path, self._client(), ""))

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._send(_json(413, {"error": f"body larger than {MAX_BODY} bytes"}))
            return
        body = self.rfile.read(length).decode("utf-8", errors="replace") if length else ""
        self._send(route(self.cfg, "POST", self.path, self._client(), body))

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self._client()} {format % args}\n")


def make_server(cfg: Config, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"cfg": cfg})
    return ThreadingHTTPServer((host, port), handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", required=True, help="JSON: nodes, state_dir, http_root, check_source")
    parser.add_argument("--listen", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8071)
    args = parser.parse_args(argv)
    server = make_server(Config.load(args.config), args.listen, args.port)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
