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


def serve_handshake(conn: socket.socket, host_key: paramiko.PKey) -> None:
    """Be an SSH server on ``conn`` through key exchange and authentication (which refuses
    every credential) for 2 s, then close."""
    transport = paramiko.Transport(conn)
    transport.set_log_channel("tests.fake_sshd")  # scans fail handshakes on purpose
    try:
        transport.add_server_key(host_key)
        transport.start_server(server=paramiko.ServerInterface())
        transport.accept(timeout=2)
    except (paramiko.SSHException, EOFError, OSError):
        pass
    finally:
        transport.close()


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
        serve_handshake(conn, self.host_key)

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


class StallingProxy:
    """Relays ``address:port`` to an SSH server on 127.0.0.1:``upstream`` and stalls each connection
    at one step of the protocol: ``kex`` (the server's KEXINIT arrives, nothing after it) or
    ``auth`` (the key exchange completes, the client's first encrypted packet, its request
    for the userauth service, is swallowed). Each connection stays open, silent."""

    SSH_MSG_KEXINIT = 20
    SSH_MSG_NEWKEYS = 21

    def __init__(self, upstream: int, step: str, hold: float = 30, address: str = "127.0.0.1", port: int = 0) -> None:
        if step not in ("kex", "auth"):
            raise ValueError(step)
        self.upstream, self.step, self.hold = upstream, step, hold
        self.sock = socket.create_server((address, port))
        self.port = self.sock.getsockname()[1]
        self._done = threading.Event()
        self.accepted = 0  # connections so far
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        server = socket.create_connection(("127.0.0.1", self.upstream))
        newkeys = threading.Event()  # the client sent its NEWKEYS: it encrypts from here on
        threading.Thread(target=self._pump, args=(server, client, "server", newkeys), daemon=True).start()
        threading.Thread(target=self._pump, args=(client, server, "client", newkeys), daemon=True).start()
        self._done.wait(self.hold)
        for s in (client, server):
            s.close()

    def _pump(self, src: socket.socket, dst: socket.socket, side: str, newkeys: threading.Event) -> None:
        """Relay whole plaintext packets (after the identification line) until the stall."""
        buf = b""
        banner = False
        try:
            while not self._done.is_set():
                chunk = src.recv(65536)
                if not chunk:
                    return
                buf += chunk
                if not banner:
                    if b"\n" not in buf:
                        continue
                    line, _, buf = buf.partition(b"\n")
                    dst.sendall(line + b"\n")
                    banner = True
                while len(buf) >= 6 and not (side == "client" and newkeys.is_set()):
                    length = int.from_bytes(buf[:4], "big")
                    if len(buf) < 4 + length:
                        break
                    packet, buf = buf[:4 + length], buf[4 + length:]
                    kind = packet[5]
                    dst.sendall(packet)
                    if side == "server" and kind == self.SSH_MSG_KEXINIT and self.step == "kex":
                        return  # nothing more from the server: the key exchange stalls
                    if side == "client" and kind == self.SSH_MSG_NEWKEYS and self.step == "auth":
                        newkeys.set()  # the encrypted service request is never relayed
                if side == "client" and newkeys.is_set():
                    buf = b""  # swallowed
        except OSError:
            return

    def close(self) -> None:
        self._done.set()
        self.sock.close()
