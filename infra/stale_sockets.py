"""Remove unix sockets left by a server killed without its ``stop`` (SIGKILL leaves them).

SeaweedFS serves gRPC on unix sockets at fixed places in /tmp named by its gRPC ports
(``/tmp/seaweedfs-volume-grpc-PORT.sock``). A store killed without ``stop`` leaves them, and a
later store that draws one of those ports again fails to start. ``infra/object_store.sh start``
calls this on the places its store will use, after drawing free TCP ports: a socket there that
refuses a connection has no server behind it and is removed; a live one, or anything that is
not a socket, is kept.
"""

from __future__ import annotations

import os
import socket
import stat
import sys


def remove_stale_sockets(paths: list[str]) -> list[str]:
    """Remove each path that is a unix socket refusing connections; return the removed ones."""
    removed = []
    for path in paths:
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
        except FileNotFoundError:
            continue
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
            except ConnectionRefusedError:
                os.unlink(path)
                removed.append(path)
            except OSError:
                continue
    return removed


if __name__ == "__main__":
    with open(sys.argv[1]) as listing:
        for gone in remove_stale_sockets(listing.read().split()):
            print(f"removed a stale socket of a killed server: {gone}", file=sys.stderr)
