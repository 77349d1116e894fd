"""A loopback port left as `make down` leaves a server's port: no listener, only a connection in TIME_WAIT (issue 34:
`make up DEVICE=cpu` right after `make down DEVICE=cpu` was refused for 48 s with "port ... is taken")."""

from __future__ import annotations

import errno
import socket


def bind_without_reuse_fails(port: int) -> bool:
    """Whether a bind without SO_REUSEADDR (the probe `make up` had before issue 34) is refused on `port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def leave_time_wait() -> int:
    """A free loopback port whose one socket is a connection in TIME_WAIT on the server's side: a listener accepts a
    connection and closes it first (the side that closes first keeps TIME_WAIT, 60 s on Linux), the client closes,
    then the listener closes. Checked: a bind without SO_REUSEADDR is refused on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            conn, _ = listener.accept()
            conn.close()  # the server closes first, as a server that stops does
            assert client.recv(1) == b""  # its FIN arrived
    assert bind_without_reuse_fails(port), f"port {port} holds no TIME_WAIT connection"
    return port
