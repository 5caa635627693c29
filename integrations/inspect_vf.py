"""inspect_ai sandbox provider "vf": each inspect sample runs in a vf-sandbox sandbox.

`pip install vf-sandbox[frameworks]` registers it through inspect's `inspect_ai`
entry point (pyproject.toml), so no import is needed:

    Task(..., sandbox="vf")                                       # SandboxSpec defaults
    Task(..., sandbox=("vf", VfSandboxConfig(isolation="gvisor", rollout_isolation="cell")))
    inspect eval task.py --sandbox vf:vf.yaml                     # the same fields as YAML / JSON

`VfSandboxConfig` picks backend, image, kernel boundary (runc / gVisor), rollout
isolation (a container or a cell per sample), limits and network; every default is
`SandboxSpec`'s (network off, capabilities dropped, pids limit).

Lifecycle, through inspect's hooks: `task_init` checks the config and starts our
reaper (sandboxes of a killed earlier run, found by their owner-pid label);
`sample_init` creates the sample's sandbox; `sample_cleanup` deletes it (also when
the sample was interrupted); `task_cleanup` deletes what is left and closes the
backend; `inspect sandbox cleanup vf [id]` removes every sandbox this provider made
(or one). Every sandbox carries vf-sandbox's lifecycle labels and a lifetime, so a
SIGKILLed inspect process is covered by the reaper and the lifetime.

How the contract maps (inspect's `SandboxEnvironment` docstrings):

* exec: a timeout raises TimeoutError (the process group is killed), a command that
  cannot start for lack of permission raises PermissionError, a signal death is
  returncode 128 + signal, output past inspect's limit raises
  OutputLimitExceededError; `user=` another user than the sandbox's raises
  SandboxUserUnsupportedError where the sandbox cannot switch users (capabilities
  dropped: the default); `user_switch=True` in the config (Docker containers only) lets
  it switch, the sandbox's agent alone holding CAP_SETUID/SETGID/SETPCAP (a sample
  declares no users up front, so it is the config's choice, off by default); an
  unknown user is a failed result naming it (as `docker exec` reports it);
  a sandbox that is gone raises SandboxUnavailableError.
* read_file / write_file: FileNotFoundError, IsADirectoryError, PermissionError from
  our typed PathErrors; a file past inspect's read limit raises OutputLimitExceededError.
* Relative paths and cwd are relative to the config's `workdir`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import posixpath
import re
from pathlib import Path
from typing import Any, Literal, Union, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel

from sandboxes import (
    ConfigError,
    FileNotFound,
    InfraError,
    IsADirectory,
    PathError,
    PermissionDenied,
    Sandbox,
    SandboxBackend,
    UnknownUser,
    UserSwitchUnsupported,
    get_backend,
)

from ._choice import FRAMEWORK_LABEL, SandboxChoice
from ._lifecycle import start_lifecycle

log = logging.getLogger(__name__)

FRAMEWORK = "inspect_ai"
TASK_LABEL = "vf-sandbox.inspect-task"


class VfSandboxConfig(SandboxChoice):
    """The sandbox of each sample (`sandbox=("vf", VfSandboxConfig(...))`); fields and
    defaults as `SandboxSpec`'s, plus the backend and the rollout isolation."""


def _load_config(config: SandboxEnvironmentConfigType | None) -> VfSandboxConfig:
    """The config from inspect: None (defaults), a VfSandboxConfig, or a YAML / JSON file."""
    if config is None:
        return VfSandboxConfig()
    if isinstance(config, VfSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return VfSandboxConfig.model_validate(config.model_dump())
    path = Path(config)
    if not path.is_file():
        raise ConfigError(f"sandbox 'vf': config {config!r} is not a file (a YAML or JSON VfSandboxConfig)")
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text) or {}
    return VfSandboxConfig.model_validate(data)


def _label_value(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63] or "task"


# One backend per (event loop, backend choice): a backend's connections belong to the
# loop that opened them, and sandboxes of one choice share it (cells share its hosts).
_backends: dict[tuple[int, str], SandboxBackend] = {}
_sandboxes: dict[str, set[Sandbox]] = {}  # task name -> live sandboxes of its samples


def _backend(cfg: VfSandboxConfig) -> SandboxBackend:
    key = cfg.backend_key()
    backend = _backends.get(key)
    if backend is None:
        backend = _backends[key] = get_backend(cfg.backend, **cfg.backend_options)
    return backend


async def _close_backends() -> None:
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _backends if k[0] == loop]:
        backend = _backends.pop(key)
        try:
            await backend.close()
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.warning("closing backend %s: %s", key[1], exc)


@sandboxenv(name="vf")
class VfSandboxEnvironment(SandboxEnvironment):
    """One sample's sandbox: inspect's operations on a vf-sandbox `Sandbox`."""

    def __init__(self, sandbox: Sandbox):
        super().__init__()
        self.sandbox = sandbox

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return VfSandboxConfig.model_validate(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        cfg = _load_config(config)
        cfg.spec()  # a config the spec refuses fails here, before any sample
        start_lifecycle(cfg.backend)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        cfg = _load_config(config)
        spec = cfg.spec(labels={FRAMEWORK_LABEL: FRAMEWORK, TASK_LABEL: _label_value(task_name)})
        sandbox = await _backend(cfg).create(spec)
        _sandboxes.setdefault(task_name, set()).add(sandbox)
        return {"default": cls(sandbox)}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for env in environments.values():
            if isinstance(env, VfSandboxEnvironment):
                await asyncio.shield(env.sandbox.delete())  # also when the sample is being cancelled
                _sandboxes.get(task_name, set()).discard(env.sandbox)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        left = _sandboxes.pop(task_name, set())
        if cleanup:
            await asyncio.gather(*(sb.delete() for sb in left), return_exceptions=True)
        elif left:
            print(f"vf sandboxes kept (--no-sandbox-cleanup): {' '.join(sorted(sb.id for sb in left))}; "
                  "remove them with `inspect sandbox cleanup vf`")
        if not any(_sandboxes.values()):
            await _close_backends()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup vf [id]`: every sandbox this provider made (default
        backend), or the one with that id."""
        backend = get_backend()
        try:
            if id:
                n = await backend.delete_many(ids=[id])
            else:
                n = await backend.delete_many(labels={FRAMEWORK_LABEL: FRAMEWORK})
            print(f"removed {n} vf sandbox(es)")
        finally:
            await backend.close()

    # ------------------------------------------------------------ operations
    def _path(self, path: str) -> str:
        return path if posixpath.isabs(path) else posixpath.join(self.sandbox.spec.workdir, path)

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        try:
            r = await self.sandbox.exec(list(cmd), stdin=input, cwd=self._path(cwd) if cwd else None, env=env,
                                        user=user, timeout=math.inf if timeout is None else float(timeout),
                                        output_limit=limit)
        except UnknownUser as exc:  # as `docker exec` reports it: a failed command naming the user
            return ExecResult(success=False, returncode=126, stdout="", stderr=f"{exc}\n")
        except UserSwitchUnsupported as exc:
            raise SandboxUserUnsupportedError(str(exc)) from exc
        except InfraError as exc:
            raise SandboxUnavailableError(f"the vf sandbox {self.sandbox.name} cannot execute: {exc}") from exc
        if r.timed_out:
            err = TimeoutError(f"Command timed out after {timeout} seconds")
            if r.stdout or r.stderr:
                setattr(err, "truncated_output", r.stdout + r.stderr)
            raise err
        if r.start_error == "EACCES":
            raise PermissionError(errno.EACCES, f"Permission denied executing command: {r.stderr.strip()}", cmd[0])
        if r.truncated:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, r.stdout + r.stderr)
        code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 9)
        return ExecResult(success=code == 0, returncode=code, stdout=r.stdout, stderr=r.stderr)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        try:
            await self.sandbox.write_file(self._path(file), contents)
        except PathError as exc:
            raise _builtin(exc, file) from exc

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str, bytes]:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        try:
            data = await self.sandbox.read_file(self._path(file), max_bytes=limit + 1)
        except PathError as exc:
            raise _builtin(exc, file) from exc
        if len(data) > limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return data.decode("utf-8") if text else data

    def default_polling_interval(self) -> float:
        return 0.2


def _builtin(exc: PathError, file: str) -> OSError:
    """The builtin inspect's contract names for one of our typed path errors."""
    if isinstance(exc, IsADirectory):
        return IsADirectoryError(errno.EISDIR, "Is a directory", file)
    if isinstance(exc, PermissionDenied):
        return PermissionError(errno.EACCES, "Permission denied", file)
    if isinstance(exc, FileNotFound):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    return FileNotFoundError(errno.ENOENT, str(exc), file)
