"""mini-swe-agent environment on vf-sandbox: `VfEnvironment`, loaded by import path.

mini-swe-agent (2.x) picks its environment class from the config's
`environment.environment_class`, which may be any import path:

    mini -c mini.yaml -c vf.yaml ...          # vf.yaml:
    environment:
      environment_class: integrations.miniswe.VfEnvironment
      image: python:3.11-slim                  # every SandboxSpec field, its defaults
      isolation: gvisor                        # runc | gvisor
      rollout_isolation: cell                  # container | cell

or from Python: `DefaultAgent(model, VfEnvironment(image=...), ...)`.

Its protocol (`minisweagent.Environment`): `execute(action, cwd="", *, timeout=None)`
runs `action["command"]` with the config's interpreter (`bash -lc`) and returns
{"output", "returncode", "exception_info"} with stderr merged into stdout in order,
as its Docker environment does; a timeout is returncode -1 with the error in
`exception_info` (the sandbox kills the command's process group and stays usable);
a first output line COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT raises `Submitted`.
`get_template_vars()` and `serialize()` as its other environments. The agent is
synchronous, our sandboxes async: the environment runs a private event loop in a
daemon thread. `cleanup()` (also at exit, and on garbage collection) deletes the
sandbox; our labels and the sandbox's lifetime cover a killed process.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import platform
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import Field

from sandboxes import Sandbox, get_backend, lifecycle

from ._choice import FRAMEWORK_LABEL, SandboxChoice

T = TypeVar("T")
FRAMEWORK = "mini-swe-agent"
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_atexit = threading.Lock()
_exiting: list[bool] = []  # set by _at_exit: the interpreter is ending


def _at_exit() -> None:
    """At exit, remove every sandbox still tracked, synchronously (mini's own environments
    rely on __del__, which runs after this, when threads can no longer be started)."""
    _exiting.append(True)
    lifecycle.cleanup_all()


_registered: list[bool] = []


class VfEnvironmentConfig(SandboxChoice):
    """The sandbox (SandboxSpec's fields and defaults, backend, rollout isolation) plus what
    mini-swe-agent's Docker environment config has for each command."""

    cwd: str = Field("", description="Working directory of commands; empty: the sandbox's `workdir`.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables of every command.")
    forward_env: list[str] = Field(default_factory=list, description="Host variables forwarded to every command "
                                   "(when set on the host; `env` wins on a conflict).")
    timeout: int = Field(30, description="Seconds one command may run.")
    interpreter: list[str] = Field(["bash", "-lc"], description="The command is appended to this argv.")


class _Loop:
    """A private event loop in a daemon thread: the sync agent's calls run there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vf-miniswe-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


class VfEnvironment:
    """mini-swe-agent's environment protocol over one vf-sandbox sandbox."""

    def __init__(self, *, config_class: type = VfEnvironmentConfig, logger: logging.Logger | None = None, **kwargs: Any):
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.config = config_class(**kwargs)
        self.sandbox: Sandbox | None = None
        with _atexit:
            if not _registered:
                atexit.register(_at_exit)
                _registered.append(True)
        self._loop = _Loop()
        self.sandbox = self._loop.run(self._create())
        self.logger.info(f"Started vf sandbox {self.sandbox.name} ({self.config.backend})")

    async def _create(self) -> Sandbox:
        self._backend = get_backend(self.config.backend, **self.config.backend_options)
        return await self._backend.create(self.config.spec(labels={FRAMEWORK_LABEL: FRAMEWORK}))

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run `action["command"]`; see the module docstring for the result."""
        assert self.sandbox is not None, "the sandbox was cleaned up"
        command = action.get("command", "")
        seconds = timeout or self.config.timeout
        env = {k: v for k in self.config.forward_env if (v := os.getenv(k)) is not None} | self.config.env
        argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *self.config.interpreter, command]  # stderr into stdout, in order
        try:
            r = self._loop.run(self.sandbox.exec(argv, cwd=cwd or self.config.cwd or None, env=env, timeout=seconds))
        except Exception as exc:  # as mini's Docker environment reports a failed `docker exec`
            output = {"output": "", "returncode": -1, "exception_info": f"An error occurred while executing the command: {exc}",
                      "extra": {"exception_type": type(exc).__name__, "exception": str(exc)}}
        else:
            if r.timed_out:
                message = f"Command timed out after {seconds} seconds"
                output = {"output": r.stdout, "returncode": -1,
                          "exception_info": f"An error occurred while executing the command: {message}",
                          "extra": {"exception_type": "TimeoutExpired", "exception": message}}
            else:
                code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 9)
                output = {"output": r.stdout, "returncode": code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        """Raises Submitted when the output's first line is the submit marker (exit 0)."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)

    def serialize(self) -> dict:
        return {"info": {"config": {
            "environment": self.config.model_dump(mode="json"),
            "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
        }}}

    def cleanup(self) -> None:
        """Delete the sandbox and stop the loop; idempotent."""
        sandbox, self.sandbox = getattr(self, "sandbox", None), None
        loop = getattr(self, "_loop", None)
        if loop is None or not loop.loop.is_running():
            return
        if _exiting or sys.is_finalizing():  # _at_exit removed the sandbox already
            loop.stop()
            return
        try:
            if sandbox is not None:
                loop.run(sandbox.delete(), timeout=60)
            if getattr(self, "_backend", None) is not None:
                loop.run(self._backend.close(), timeout=30)
        except Exception as exc:  # noqa: BLE001 - the reaper and the lifetime get the rest
            self.logger.warning(f"vf sandbox cleanup: {exc}")
        finally:
            loop.stop()

    def __del__(self) -> None:
        self.cleanup()
