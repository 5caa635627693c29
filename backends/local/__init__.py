"""The `local` backend: sandboxes as host processes in a per-sandbox directory,
confined with bubblewrap when usable. Not a security boundary (see backend.py)."""

from .backend import LocalBackend, LocalConfig, LocalSandbox

__all__ = ["LocalBackend", "LocalConfig", "LocalSandbox"]
