"""Free ports on 127.0.0.1, chosen at runtime."""

from __future__ import annotations

import socket


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_tcp_port() -> int:
    return free_port(socket.SOCK_STREAM)


def free_udp_port() -> int:
    return free_port(socket.SOCK_DGRAM)
