"""``infra/stale_sockets.py``: a unix socket with no server behind it is removed; a live one,
a regular file and a missing path are left alone."""

from __future__ import annotations

import os
import socket

from infra.stale_sockets import remove_stale_sockets


def test_only_sockets_refusing_connections_are_removed(tmp_path) -> None:
    stale, live, plain = (str(tmp_path / n) for n in ("stale.sock", "live.sock", "plain.sock"))
    left = socket.socket(socket.AF_UNIX)
    left.bind(stale)
    left.close()  # the file stays, as after a SIGKILL
    server = socket.socket(socket.AF_UNIX)
    server.bind(live)
    server.listen()
    with open(plain, "w") as fh:
        fh.write("not a socket")
    try:
        removed = remove_stale_sockets([stale, live, plain, str(tmp_path / "missing.sock")])
        assert removed == [stale]
        assert not os.path.exists(stale)
        assert os.path.exists(live) and os.path.exists(plain)
    finally:
        server.close()
