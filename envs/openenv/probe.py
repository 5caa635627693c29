"""What an OpenEnv project's server really serves: `openenv build` starts the built
image's server once in a sandbox (the same start path as a rollout, `server.py`),
asks its `/schema` and decides the contract from the answer (`contract_from_schema`:
an action with `tool_name` + `arguments`, or the `list_tools` / `call_tool` type
values, is mcp; anything else gym). Reading the source instead misses an aliased
import, a subclass of `CallToolAction` or an app built in another module.
"""

from __future__ import annotations

from typing import Any

from sandboxes.errors import ServerStartError
from sandboxes.images import run_sync
from sandboxes.interface import SandboxBackend
from sandboxes.registry import get_backend
from sandboxes.spec import SandboxSpec

from .contract import contract_from_schema
from .forwarder import Forwarder
from .manifest import Contract
from .server import start_server

PROBE_LABEL = "vf-sandbox.openenv-probe"


async def probe_schema(image: str, start_command: str, port: int, *, environment_id: str,
                       backend: str | SandboxBackend | None = None, startup_timeout: float = 300.0,
                       python: str = "python3") -> dict[str, Any]:
    """Start the server of `image` once in a sandbox on `backend` (default docker), return
    its `/schema`, delete the sandbox. ServerStartError (with the log tail) when it never
    gets healthy."""
    owned = backend is None or isinstance(backend, str)
    be: Any = get_backend(backend or "docker") if owned else backend
    spec = SandboxSpec(image=image, name=f"openenv-probe-{environment_id}"[:40], cpu_cores=2, memory_gb=4,
                       timeout_minutes=15, environment_vars={"ENABLE_WEB_INTERFACE": "false"},
                       labels={PROBE_LABEL: environment_id[:63]})
    try:
        sandbox = await be.create(spec)
        try:
            handle = await start_server(sandbox, start_command,
                                        lambda: Forwarder.start_in_sandbox(sandbox, port, python=python),
                                        startup_timeout=startup_timeout,
                                        what=f"openenv build: the server of {environment_id!r} ({image})")
            try:
                return await handle.session.schema()
            finally:
                await handle.transport.close()
        finally:
            await sandbox.delete()
    finally:
        if owned:
            await be.close()


def probe_contract(image: str, start_command: str, port: int, *, environment_id: str,
                   backend: str | SandboxBackend | None = None, startup_timeout: float = 300.0) -> Contract:
    """The contract the server of `image` serves (sync; see `probe_schema`)."""
    try:
        schema = run_sync(lambda: probe_schema(image, start_command, port, environment_id=environment_id,
                                               backend=backend, startup_timeout=startup_timeout))
    except ServerStartError as exc:
        raise ServerStartError(f"{exc}\n(the contract, gym or mcp, is read from the running server's /schema, "
                               "so the server must start)") from exc
    return contract_from_schema(schema)
