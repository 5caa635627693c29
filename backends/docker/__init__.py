"""Docker backend: containers through the Engine API (aiodocker), commands
through the in-sandbox agent, images built from `images/` recipes."""

from .backend import DockerBackend, DockerSandbox, ping_sync, remove_container_sync, resolve_url

__all__ = ["DockerBackend", "DockerSandbox", "ping_sync", "remove_container_sync", "resolve_url"]
