"""Test stand-in for a mail server: accepts every message and appends it to a file (one JSON
per line: the login it was sent with, the envelope and the text).

Runs on the monitoring head of the monitoring scenario, on 127.0.0.1 only. It speaks just the
SMTP that Alertmanager's e-mail notifier uses: EHLO (offering AUTH PLAIN, no STARTTLS: the
receiver has require_tls: false), AUTH PLAIN, MAIL, RCPT, DATA, RSET, NOOP, QUIT.
Usage: smtp_sink.py PORT FILE
"""

from __future__ import annotations

import base64
import binascii
import json
import socketserver
import sys
from pathlib import Path
from typing import Any


class Session(socketserver.StreamRequestHandler):
    out = Path("/dev/null")
    timeout = 60  # seconds a client may stay silent

    def reply(self, line: str) -> None:
        self.wfile.write(line.encode() + b"\r\n")
        self.wfile.flush()

    def read_line(self) -> str | None:
        raw = self.rfile.readline(65536)
        return raw.decode("utf-8", "replace").rstrip("\r\n") if raw else None

    def handle(self) -> None:
        mail: dict[str, Any] = {"auth": None, "from": "", "to": []}
        self.reply("220 sink ESMTP")
        while (line := self.read_line()) is not None:
            verb, _, arg = line.partition(" ")
            verb = verb.upper()
            if verb == "EHLO":
                self.reply("250-sink")
                self.reply("250 AUTH PLAIN")
            elif verb == "HELO":
                self.reply("250 sink")
            elif verb == "AUTH":
                mail["auth"] = self.plain(arg)
                self.reply("235 2.7.0 accepted" if mail["auth"] else "501 5.5.2 only AUTH PLAIN <response>")
            elif verb == "MAIL":
                mail.update({"from": arg.partition(":")[2].strip().strip("<>"), "to": []})
                self.reply("250 ok")
            elif verb == "RCPT":
                mail["to"].append(arg.partition(":")[2].strip().strip("<>"))
                self.reply("250 ok")
            elif verb == "DATA":
                self.reply("354 end with <CRLF>.<CRLF>")
                body: list[str] = []
                while (text := self.read_line()) is not None and text != ".":
                    body.append(text[1:] if text.startswith("..") else text)
                with self.out.open("a") as fh:
                    fh.write(json.dumps({**mail, "data": "\n".join(body)}) + "\n")
                self.reply("250 ok: queued")
            elif verb in ("RSET", "NOOP"):
                self.reply("250 ok")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("502 5.5.1 not implemented")

    @staticmethod
    def plain(arg: str) -> list[str] | None:
        """[user, password] of ``AUTH PLAIN <base64 of authzid NUL user NUL password>``."""
        mech, _, response = arg.partition(" ")
        if mech.upper() != "PLAIN" or not response:
            return None
        try:
            _authzid, user, password = base64.b64decode(response, validate=True).decode().split("\0")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        return [user, password]


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


if __name__ == "__main__":
    Session.out = Path(sys.argv[2])
    with Server(("127.0.0.1", int(sys.argv[1])), Session) as server:
        server.serve_forever()
