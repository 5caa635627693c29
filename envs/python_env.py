"""`PythonEnv`: a persistent Python interpreter in the rollout's sandbox,
exposed to the model as a `python(code)` tool.

One worker process (`sandbox_tools/repl_worker.py`, stdlib only) keeps one
namespace across calls: stdout, stderr, `Out[n]` of a trailing expression and
tracebacks come back; output is capped. A cell past its timeout gets a
KeyboardInterrupt and the namespace survives; a worker that dies (or ignores
the interrupt) is restarted and the model is told its state was lost. Every
request and response carries an id, so a timeout never desynchronises them.

`pip_install_packages` are baked into a derived image once when the backend
offers the `SupportsDerivedImages` capability (docker: cached by content,
wheels downloaded on the host); on other backends they are pip-installed at
boot, as the reference does. `python` replaces `bash` as the model's tool
unless `expose_bash=True`. With `setup_scope="group"` the boot-time install runs once
per group and each rollout's fork carries it; the REPL starts in every rollout.

Metric added: `python_ready_wait_time`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from sandboxes import SandboxSpec, UsageError

from .sandbox_env import SandboxEnv, SandboxRollout
from .sandbox_tools.repl_session import ReplSession
from .types import State

log = logging.getLogger("envs.sandbox")


def normalize_packages(packages: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """"numpy sympy" or ["numpy", "sympy"] -> sorted unique requirement strings."""
    if not packages:
        return []
    items = packages.split() if isinstance(packages, str) else [p for item in packages for p in str(item).split()]
    return sorted(set(items))


class PythonEnv(SandboxEnv):
    """SandboxEnv whose tool is a persistent Python REPL."""

    def __init__(
        self,
        pip_install_packages: str | list[str] = "numpy sympy scipy",
        max_startup_wait_seconds: int = 30,
        *,
        expose_bash: bool = False,
        python_executable: str = "python3",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.pip_install_packages = normalize_packages(pip_install_packages)
        self.max_startup_wait_seconds = float(max_startup_wait_seconds)
        self.python_executable = python_executable
        self._image_cache: dict[str, str] = {}
        self._image_failures: dict[str, Exception] = {}
        self._image_lock: asyncio.Lock | None = None
        self.sandbox_metric_names = (*self.sandbox_metric_names, "python_ready_wait_time")
        if not expose_bash:
            self.remove_tool("bash")
        self.add_tool(self.python, args_to_skip=["sandbox_id"])

    # ------------------------------------------------------------------ image with packages
    def _derive_image(self) -> Any:
        """The backend's `derive_image` (SupportsDerivedImages), or None."""
        return getattr(self.backend, "derive_image", None)

    async def resolve_spec(self, spec: SandboxSpec) -> SandboxSpec:
        spec = await super().resolve_spec(spec)
        derive = self._derive_image()
        if not self.pip_install_packages or derive is None:
            return spec
        if self._image_lock is None:
            self._image_lock = asyncio.Lock()
        async with self._image_lock:
            failed = self._image_failures.get(spec.image)
            if failed is not None:  # do not download and build again for every rollout
                raise failed
            image = self._image_cache.get(spec.image)
            if image is None:
                t0 = time.monotonic()
                try:
                    image = await derive(spec.image, self.pip_install_packages)
                except UsageError as exc:
                    self._image_failures[spec.image] = exc
                    raise
                self._image_cache[spec.image] = image
                log.info("python packages image %s ready in %.1fs", image, time.monotonic() - t0)
        return spec.model_copy(update={"image": image})

    # ------------------------------------------------------------------ lifecycle
    async def prepare_sandbox(self, state: State) -> None:
        """The sandbox setup (once per group with `setup_scope="group"`): the boot-time pip
        install where the backend cannot bake a derived image, then `post_sandbox_setup`."""
        if self.pip_install_packages and self._derive_image() is None:
            await self._pip_install_at_boot(self._live(state["sandbox_id"]))
        await super().prepare_sandbox(state)

    async def setup_state(self, state: State) -> State:
        state = await super().setup_state(state)
        live = self._live(state["sandbox_id"])
        sandbox = live.sandbox
        repl = ReplSession(
            lambda argv, env: sandbox.start_process(list(argv), env=env),
            python=self.python_executable,
            output_limit=self.output_limit_bytes,
            startup_timeout=self.max_startup_wait_seconds,
        )
        await repl.start()
        live.extra["repl"] = repl
        state["python_ready_wait_time"] = repl.ready_wait
        return state

    async def _pip_install_at_boot(self, live: SandboxRollout) -> None:
        argv = [self.python_executable, "-m", "pip", "install", "-q", *self.pip_install_packages]
        r = await live.sandbox.exec(argv, timeout=max(120.0, self.max_startup_wait_seconds))
        if not r.ok:
            log.warning("pip install in the sandbox failed (exit %s): %s", r.exit_code, r.output[-500:])

    # ------------------------------------------------------------------ the tool
    async def python(self, code: str, sandbox_id: str) -> str:
        """Execute `code` in a persistent Python interpreter inside the sandbox.

        Args:
            code: Python source. Variables, imports and functions persist between calls;
                the value of a trailing expression is shown as Out[n].
        """
        live = self._live(sandbox_id)
        repl: ReplSession | None = live.extra.get("repl")
        if repl is None:
            raise RuntimeError("the Python worker is not running in this rollout")
        state = live.extra.get("state")
        t0 = time.monotonic()
        try:  # InfraError (sandbox gone) propagates: the rollout is retried
            res = await repl.run(code, self.timeout_per_command_seconds)
        finally:
            self._count_command(state, t0)
        if state is not None:
            if res.timed_out:
                state["sandbox_timeout"] = True
            if res.oom_kills is not None:
                self._note_oom(live, state, res.oom_kills)
            elif res.restarted and not res.timed_out:
                await self._check_oom(live, state)
        return res.render()
