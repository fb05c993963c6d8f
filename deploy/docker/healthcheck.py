"""The executor image's health check: GET /v2/health/<live|ready> (argument; default live) on
127.0.0.1 at FX_EXECUTOR_HTTP_PORT (default 8088). Port 0 (an ephemeral port: replicas of a scaled
service on the host network) is looked up: the TCP port PID 1 (the executor) listens on."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path


def listening_port(pid: int = 1) -> int:
    """The first TCP port process ``pid`` listens on (its socket inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                return int(fields[1].rsplit(":", 1)[1], 16)
    raise SystemExit("no listening socket")


def main() -> None:
    port = int(os.environ.get("FX_EXECUTOR_HTTP_PORT") or 8088)
    if port == 0:
        port = listening_port()
    what = sys.argv[1] if len(sys.argv) > 1 else "live"
    urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/{what}", timeout=4)


if __name__ == "__main__":
    main()
