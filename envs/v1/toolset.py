"""`Toolset` and `MCPTool`: the tools a v1 harness offers the model.

A Toolset packages callables (and MCP servers) with:
- visibility: `show` / `hide` lists, narrowed further per task by
  `task["tools"] = {"show": [...]}` or `{"hide": [...]}`;
- bindings: hidden arguments filled by the framework, never by the model.
  A binding source is a framework path string (`"task.answer"`,
  `"state.info"`, `"objects.db"`) or a callable `(task, state) -> value`
  (bind literals through a callable);
- scope and `write`, as the reference: the toolset's private objects and its
  MCP server processes live per `scope` (`"rollout"`: built for each rollout,
  dropped / stopped when it ends; `"group"`: once per example; `"global"`:
  once per toolset; both until teardown). Without `scope`, a `write=True`
  toolset (its tools change what they act on) is per rollout and a read-only
  one (`write=False`, the default) global, shared by every rollout;
- private objects: `objects={"db": factory}`, only reachable through
  `objects.*` bindings, never from state;
- `sandbox`: `"program"` runs the tools in the harness's sandbox (the
  program's), a SandboxConfig in a sandbox of the toolset's own, one per
  `SandboxConfig.scope` (rollout by default: deleted with the rollout; group /
  global: at teardown) whatever `write` says, as the reference; each call runs the module-level
  function by reference there (its package uploaded, arguments and result
  JSON, `sandbox_python.call_in_sandbox`); no MCPTool, no `objects.*`
  bindings in a sandboxed toolset;
- lifecycle handlers `setups` / `cleanups` `(task, state)` and `teardowns` `()`;
- `stops` `(task, state) -> bool`: checked by the base tool loop after each
  turn with the harness's and the taskset's (the first that fires names the
  stop condition); `updates` `(task, state)`: run by the base loop after each
  turn, before the stops; both refused under any other program form.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from sandboxes.errors import ConfigError, InfraError, UsageError

from ..tool_schema import convert_func_to_tool_def
from ..types import Tool
from .config import SandboxConfig, ToolsetConfig, resolve_ref
from .sandbox_python import PythonProgram, call_in_sandbox, install, python_program
from .usercode import call_user

Scope = Literal["rollout", "group", "global"]
log = logging.getLogger(__name__)


def _field(obj: Any, *names: str) -> Any:
    """An attribute under its mcp 2.x or 1.x name."""
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


class MCPTool:
    """The tools of an MCP server started as a process over stdio (`mcp` package)."""

    def __init__(self, command: str, args: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None):
        self.command, self.args, self.env, self.cwd = command, list(args or []), dict(env) if env else None, cwd
        self._owner: asyncio.Task[None] | None = None
        self._session: Any = None
        self.tool_defs: list[Tool] = []

    async def start(self) -> None:
        """Start the server once. Its client lives in one owner task (anyio scopes must be
        entered and left by the same task); calls come from any task."""
        if self._session is not None:
            return
        if self._owner is None:
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._closing = asyncio.Event()
            self._owner = asyncio.create_task(self._own(ready))
            self._ready = ready
        await asyncio.shield(self._ready)

    async def _own(self, ready: "asyncio.Future[None]") -> None:
        try:
            from mcp import StdioServerParameters
        except ImportError:
            ready.set_exception(ConfigError("MCPTool needs the `mcp` package: install vf-sandbox[mcp]"))
            return
        params = StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd)
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    from mcp.client.client import Client  # mcp >= 2

                    session = await stack.enter_async_context(Client(params))
                except ImportError:  # mcp 1.x
                    from mcp import ClientSession
                    from mcp.client.stdio import stdio_client

                    read, write = await stack.enter_async_context(stdio_client(params))
                    session = await stack.enter_async_context(ClientSession(read, write))
                    await session.initialize()
                listed = await session.list_tools()
                self.tool_defs = [
                    Tool(name=t.name, description=t.description or "",
                         parameters=_field(t, "input_schema", "inputSchema") or {"type": "object", "properties": {}})
                    for t in listed.tools]
                self._session = session
                ready.set_result(None)
                await self._closing.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(InfraError(f"MCP server {self.command} {' '.join(self.args)} failed: {exc}"))
            else:
                log.warning("MCP server %s ended with %s", self.command, exc)
        finally:
            self._session = None

    def callables(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        def make(name: str) -> Callable[..., Awaitable[Any]]:
            async def call(**kwargs: Any) -> Any:
                result = await self._session.call_tool(name, kwargs)
                parts = [{"type": "text", "text": c.text} for c in result.content if getattr(c, "type", "") == "text"]
                if _field(result, "is_error", "isError"):
                    raise RuntimeError(" ".join(p["text"] for p in parts) or f"MCP tool {name} failed")
                return parts[0]["text"] if len(parts) == 1 else parts
            call.__name__ = name
            return call

        return {t.name: make(t.name) for t in self.tool_defs}

    async def close(self) -> None:
        if self._owner is not None:
            owner, self._owner = self._owner, None
            self._closing.set()
            with contextlib.suppress(Exception):
                await owner


class Toolset:
    def __init__(
        self,
        tools: Sequence[Any] = (),
        show: Sequence[str] | None = None,
        hide: Sequence[str] | None = None,
        bindings: Mapping[str, Any] | None = None,
        objects: Mapping[str, Callable[..., Any]] | None = None,
        write: bool = False,
        scope: Scope | None = None,
        sandbox: Any = None,
        stops: Sequence[Callable[..., Any]] = (),
        setups: Sequence[Callable[..., Any]] = (),
        updates: Sequence[Callable[..., Any]] = (),
        cleanups: Sequence[Callable[..., Any]] = (),
        teardowns: Sequence[Callable[..., Any]] = (),
        config: ToolsetConfig | Mapping[str, object] | None = None,
    ):
        """The toolset's tools (the config's first, then `tools`, then the config's MCP servers),
        visibility, scope, bindings and handlers (see the module docstring); a bad setting
        (scope, `write`, a binding naming no tool...) is a ConfigError."""
        cfg = ToolsetConfig.from_config(config) if config is not None else None
        if not isinstance(write, bool):
            raise ConfigError(f"Toolset write must be a boolean, not {write!r}")
        self.write = write or bool(cfg and cfg.write)
        self.tools: list[Any] = [resolve_ref(t) for t in [*(cfg.tools if cfg else []), *tools]]
        if cfg:
            self.tools += [MCPTool(m.command, m.args, m.env, m.cwd) for m in cfg.mcp]
        self.show = list(show if show is not None else (cfg.show if cfg and cfg.show is not None else [])) or None
        self.hide = set(hide if hide is not None else (cfg.hide if cfg and cfg.hide else []))
        self.scope: Scope = scope or (cfg.scope if cfg and cfg.scope else None) or (
            "rollout" if self.write else "global")
        if self.scope not in ("rollout", "group", "global"):
            raise ConfigError(f"Toolset scope must be rollout, group or global, not {self.scope!r}")
        self.bindings = dict(bindings or {})
        self.objects = dict(objects or {})
        self.setups, self.cleanups, self.teardowns = list(setups), list(cleanups), list(teardowns)
        self.stops = [resolve_ref(f) for f in stops]  # (task, state) -> bool, checked by the base loop after each turn
        self.updates = [resolve_ref(f) for f in updates]  # (task, state), run by the base loop after each turn
        self._scoped: dict[Any, dict[str, Any]] = {}
        self._mcp: dict[Any, list[MCPTool]] = {}  # scope key -> this scope's MCP server processes
        self.sync_pool: Any = None  # where sync tools / handlers run (the harness's pool; None: the default)
        self._init_sandboxes(sandbox)
        self._check_bindings()

    def _init_sandboxes(self, sandbox: Any) -> None:
        """Where the tools run: on the host (`sandbox=None`) or in a sandbox (`_set_sandbox`);
        the per-sandbox bookkeeping starts empty."""
        self.sandbox: SandboxConfig | str | None = None
        self._programs: dict[str, PythonProgram] = {}  # tool name -> what runs in the sandbox
        self._sandboxes: dict[Any, Any] = {}  # scope key -> this toolset's own sandbox
        self._installed: set[str] = set()  # sandbox ids the tools' packages were uploaded to
        self._sandbox_locks: dict[Any, asyncio.Lock] = {}
        if sandbox is not None:
            self._set_sandbox(sandbox)

    def _check_bindings(self) -> None:
        """Each binding is 'tool.arg' for one of the toolset's callables; a string source is a
        framework path (task.*, state.*, objects.*), and objects.* never reaches a sandboxed tool."""
        names = [getattr(t, "__name__", None) for t in self.tools if not isinstance(t, MCPTool)]
        for target, source in self.bindings.items():
            if "." not in target:
                raise ConfigError(f"Toolset binding {target!r} must be 'tool.arg'")
            tool = target.split(".", 1)[0]
            if tool not in names:
                raise ConfigError(f"Toolset binding {target!r}: no tool {tool!r} (have {names})")
            if isinstance(source, str) and not source.startswith(("task.", "state.", "objects.")):
                raise ConfigError(f"Toolset binding {target!r}: string sources are framework paths "
                                  "(task.*, state.*, objects.*); bind a literal through a callable")
            if self.sandbox is not None and isinstance(source, str) and source.startswith("objects."):
                raise ConfigError(f"Toolset binding {target!r}: private objects live on the host and cannot "
                                  "reach a sandboxed tool (its arguments are JSON)")

    def _set_sandbox(self, sandbox: Any) -> None:
        """`sandbox="program"`: the tools run in the harness's sandbox (its program's);
        a SandboxConfig / mapping: in a sandbox of the toolset's own, one per scope."""
        if isinstance(sandbox, str):
            if sandbox != "program":
                raise ConfigError(f'Toolset sandbox must be "program" or a SandboxConfig, not {sandbox!r}')
            self.sandbox = sandbox
        else:
            self.sandbox = SandboxConfig.from_config(sandbox)
            if self.sandbox.backend is not None:
                raise ConfigError("a sandboxed toolset's sandboxes come from the run's backend; drop sandbox.backend")
        for tool in self.tools:
            if isinstance(tool, MCPTool):
                raise ConfigError("an MCPTool cannot run in a sandboxed toolset yet (give it a toolset of its own)")
            self._programs[tool.__name__] = python_program(tool)

    async def _tool_sandbox(self, task: Mapping[str, Any], state: Any) -> Any:
        """The sandbox this call runs in, its packages uploaded (once per sandbox; one
        lock per rollout / scope, so rollouts never wait on each other's creations)."""
        key = (("program", state["trajectory_id"]) if self.sandbox == "program"
               else self._scope_key(task, state, self.sandbox.scope))
        lock = self._sandbox_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if self.sandbox == "program":
                getter = state.runtime.get("sandbox_for")
                if getter is None:
                    raise ConfigError('a toolset with sandbox="program" runs under a Harness with a sandbox')
                sandbox = await getter()
            else:
                sandbox = self._sandboxes.get(key)
                if sandbox is None:
                    sandbox = self._sandboxes[key] = await state.runtime["new_sandbox"](self.sandbox)
            if sandbox.id not in self._installed:
                for prog in {p.root: p for p in self._programs.values()}.values():
                    await install(sandbox, prog)
                self._installed.add(sandbox.id)
        return sandbox

    async def _delete_sandbox(self, key: Any) -> None:
        sandbox = self._sandboxes.pop(key, None)
        if sandbox is not None:
            self._installed.discard(sandbox.id)
            try:
                await sandbox.delete()
            except Exception as exc:
                log.warning("deleting a toolset sandbox failed: %s", exc)

    # ---- objects by scope
    def _scope_key(self, task: Mapping[str, Any], state: Any, scope: Scope | None = None) -> tuple[Any, ...]:
        return {"rollout": ("rollout", state["trajectory_id"]), "group": ("group", task.get("example_id")),
                "global": ("global",)}[scope or self.scope]

    async def _mcp_servers(self, task: Mapping[str, Any], state: Any) -> list[MCPTool]:
        """This scope's MCP server processes (started on first use): the configured MCPTools
        themselves when global, fresh copies of them per rollout / example otherwise."""
        key = self._scope_key(task, state)
        servers = self._mcp.get(key)
        if servers is None:
            templates = [t for t in self.tools if isinstance(t, MCPTool)]
            servers = self._mcp[key] = templates if self.scope == "global" else [
                MCPTool(t.command, t.args, t.env, t.cwd) for t in templates]
        for server in servers:
            await server.start()
        return servers

    async def _close_mcp(self, key: Any) -> None:
        for server in self._mcp.pop(key, []):
            await server.close()

    async def _objects_for(self, task: Mapping[str, Any], state: Any) -> dict[str, Any]:
        key = self._scope_key(task, state)
        if key not in self._scoped:
            self._scoped[key] = {n: await call_user(self.sync_pool, f) for n, f in self.objects.items()}
        return self._scoped[key]

    def _source(self, source: Any, task: Mapping[str, Any], state: Any, objects: dict[str, Any]) -> Any:
        if callable(source):
            return source(task, state)
        root, _, path = source.partition(".")
        obj: Any = {"task": task, "state": state, "objects": objects}[root]
        for part in path.split("."):
            try:
                obj = obj[part]
            except (KeyError, TypeError):
                raise UsageError(f"binding source {source!r}: no {part!r}") from None
        return obj

    def _visible(self, name: str, task: Mapping[str, Any]) -> bool:
        if self.show is not None and name not in self.show:
            return False
        if name in self.hide:
            return False
        rule = task.get("tools") or {}
        if "show" in rule and name not in rule["show"]:
            return False
        return name not in (rule.get("hide") or [])

    async def resolve(self, task: Mapping[str, Any], state: Any) -> tuple[dict[str, Callable[..., Awaitable[Any]]], list[Tool]]:
        """The visible tools for this rollout (callables with bindings applied) and their schemas."""
        objects = await self._objects_for(task, state)
        callables: dict[str, Callable[..., Awaitable[Any]]] = {}
        defs: list[Tool] = []
        servers = iter(await self._mcp_servers(task, state) if any(isinstance(t, MCPTool) for t in self.tools) else [])
        for tool in self.tools:
            if isinstance(tool, MCPTool):  # this scope's process of it
                server = next(servers)
                for d in server.tool_defs:
                    if self._visible(d.name, task):
                        callables[d.name] = server.callables()[d.name]
                        defs.append(d)
                continue
            name = tool.__name__
            if not self._visible(name, task):
                continue
            bound = {t.split(".", 1)[1]: s for t, s in self.bindings.items() if t.split(".", 1)[0] == name}
            defs.append(convert_func_to_tool_def(tool, skip=list(bound)))
            callables[name] = self._bind(tool, bound, task, state, objects)
        return callables, defs

    def _bind(self, fn: Callable[..., Any], bound: dict[str, Any], task: Mapping[str, Any], state: Any,
              objects: dict[str, Any]) -> Callable[..., Awaitable[Any]]:
        prog = self._programs.get(fn.__name__)

        async def call(**kwargs: Any) -> Any:
            for arg, source in bound.items():
                kwargs[arg] = self._source(source, task, state, objects)
            if prog is not None:  # a sandboxed toolset: the call runs in its sandbox
                timeout = self.sandbox.timeout_per_command_seconds if isinstance(self.sandbox, SandboxConfig) else 600.0
                return await call_in_sandbox(prog, await self._tool_sandbox(task, state), kwargs, timeout)
            return await call_user(self.sync_pool, fn, **kwargs)

        call.__name__ = fn.__name__
        return call

    async def setup(self, task: Mapping[str, Any], state: Any) -> None:
        for fn in self.setups:
            await call_user(self.sync_pool, fn, task, state)

    async def cleanup(self, task: Mapping[str, Any], state: Any) -> None:
        for fn in self.cleanups:
            await call_user(self.sync_pool, fn, task, state)
        self._scoped.pop(("rollout", state["trajectory_id"]), None)
        await self._close_mcp(("rollout", state["trajectory_id"]))
        await self._delete_sandbox(("rollout", state["trajectory_id"]))
        if self.sandbox == "program" and state.runtime.get("sandbox") is not None:
            self._installed.discard(state.runtime["sandbox"].id)  # the harness deletes it after this
        self._sandbox_locks.pop(("program", state["trajectory_id"]), None)
        self._sandbox_locks.pop(("rollout", state["trajectory_id"]), None)

    async def teardown(self) -> None:
        for fn in self.teardowns:
            await call_user(self.sync_pool, fn)
        for key in list(self._mcp):
            await self._close_mcp(key)
        for tool in self.tools:
            if isinstance(tool, MCPTool):
                await tool.close()
        self._scoped.clear()
        for key in list(self._sandboxes):
            await self._delete_sandbox(key)
        self._sandbox_locks.clear()
