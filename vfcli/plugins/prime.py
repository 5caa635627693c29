"""The Prime CLI plugin contract: `prime` asks `get_plugin()` (or `plugin()`) for
the modules to run and runs `build_module_command(module, args)`, i.e.
`python -m <module> ARGS` with this interpreter. vf-sandbox provides eval and
install; gepa / init / setup / build have no vf-sandbox command, so their
modules are None and asking for them is a UsageError (never a silent no-op)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sandboxes.errors import UsageError

PRIME_PLUGIN_API_VERSION = 1


@dataclass(frozen=True)
class PrimeCLIPlugin:
    api_version: int = PRIME_PLUGIN_API_VERSION
    eval_module: str = "vfcli.commands.eval"
    gepa_module: str | None = None
    install_module: str = "vfcli.commands.install"
    init_module: str | None = None
    setup_module: str | None = None
    build_module: str | None = None

    def build_module_command(self, module_name: str | None, args: Sequence[str] | None = None) -> list[str]:
        """The subprocess argv that runs `module_name` with `args`."""
        if not module_name:
            raise UsageError("this command is not provided by vf-sandbox (its plugin module is None)")
        return [sys.executable, "-m", module_name, *(args or [])]


def get_plugin() -> PrimeCLIPlugin:
    return PrimeCLIPlugin()


plugin = get_plugin
