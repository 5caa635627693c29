"""Where the Docker Engine API is: the one place its address is resolved.

Shared by the backend (aiodocker) and the image builder (docker-py) so that
neither imports the other."""

from __future__ import annotations

import os

DEFAULT_URL = "unix:///var/run/docker.sock"


def resolve_url(url: str | None = None) -> str:
    """The Engine API address: explicit, else $DOCKER_HOST, else the default unix socket."""
    return url or os.environ.get("DOCKER_HOST") or DEFAULT_URL
