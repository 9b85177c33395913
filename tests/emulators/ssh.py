"""A tiny SSH server on 127.0.0.1 (paramiko): it completes key exchange, so clients
can read its host key, and then closes. Its host key can be swapped while it runs
(an installer's SSH server, then the installed system's)."""

from __future__ import annotations

import logging
import socket
import threading
from types import TracebackType

import paramiko

from emulators.ports import free_tcp_port

logging.getLogger("tests.fake_sshd").setLevel(logging.CRITICAL)
logging.getLogger("tests.fake_sshd").propagate = False


def new_host_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate(bits=256)


def public_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


class FakeSshServer:
    def __init__(self, host_key: paramiko.PKey, port: int | None = None) -> None:
        self.host_key = host_key
        self.port = port or free_tcp_port()
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> FakeSshServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(16)
        sock.settimeout(0.2)
        self._sock = sock
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=f"fake-sshd-{self.port}")
        self._thread.start()
        return self

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(conn,), daemon=True).start()

    def _handshake(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.set_log_channel("tests.fake_sshd")  # scans fail handshakes on purpose
        try:
            transport.add_server_key(self.host_key)
            transport.start_server(server=paramiko.ServerInterface())
            transport.accept(timeout=2)
        except (paramiko.SSHException, EOFError, OSError):
            pass
        finally:
            transport.close()

    def stop(self) -> None:
        self._stop.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeSshServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
