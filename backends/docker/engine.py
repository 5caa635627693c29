"""Where the Docker Engine API is: the one place its address is resolved.

Shared by the backend (aiodocker) and the image builder (docker-py) so that
neither imports the other; `_sync_conn` is the blocking HTTP connection to it
(signal handlers, atexit, CLIs: no event loop)."""

from __future__ import annotations

import http.client
import os
import re
import socket

DEFAULT_URL = "unix:///var/run/docker.sock"


def resolve_url(url: str | None = None) -> str:
    """The Engine API address: explicit, else $DOCKER_HOST, else the default unix socket."""
    return url or os.environ.get("DOCKER_HOST") or DEFAULT_URL


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _sync_conn(url: str, timeout: float) -> http.client.HTTPConnection:
    if url.startswith("unix://"):
        return _UnixHTTPConnection(url[len("unix://"):], timeout)
    hostport = re.sub(r"^(tcp|http)://", "", url).rstrip("/")
    return http.client.HTTPConnection(hostport, timeout=timeout)
