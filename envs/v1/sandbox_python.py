"""Python programs (`{"fn": "pkg.module:run"}` or a module-level callable) in a
v1 harness's sandbox.

The program's owning local package is uploaded and put on PYTHONPATH, by the
reference's rule: a module inside a package belongs to its top-level package
directory (whose `pyproject.toml` lists its dependencies), a single-file
module is that file (with `pyproject.toml` beside it). `python_runner.py`
(sandboxes/programs/)
then runs the program there for one rollout with an in-sandbox `State`; its
model calls reach the interception endpoint through the relay over the
sandbox's command channel (`sandbox_relay`), so the network stays off and
every call is recorded on the host state like any other program's. What the
program leaves in its state comes back (JSON), as do `state.stop(...)` and
what it raised.

The sandbox has no network, so nothing is installed: the package's
`[project.dependencies]` must already be in the image. They are checked in
the sandbox before the program runs and a ConfigError names the missing ones.
"""

from __future__ import annotations

import importlib
import json
import re
import sysconfig
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxes.errors import ConfigError, Error, PathError
from sandboxes.program_files import program_path

from .config import is_ref, resolve_ref
from .programs import record_result
from .sandbox_relay import SandboxRelay
from .state import MANAGED_FIELDS

RUNNER_SOURCE = program_path("python_runner.py")
BASE = "/tmp/vf_v1"
PKG_DIR = f"{BASE}/pkgs"
RUNNER_PATH = f"{BASE}/python_runner.py"
NOT_SENT = frozenset({"trajectory", "timing", "usage"}) | MANAGED_FIELDS
NOT_RETURNED = NOT_SENT | {"trajectory_id", "reward"}
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class SandboxedProgramError(Error):
    """A Python program raised in its sandbox (a task error, like an in-process
    program's exception); `remote_traceback` is the traceback printed there."""

    def __init__(self, message: str, remote_traceback: str | None = None):
        super().__init__(message)
        self.remote_traceback = remote_traceback


@dataclass(frozen=True)
class PythonProgram:
    """What to upload and run: `ref` ("pkg.module:attr"), the local `root` (a
    package directory or a single module file) importable as `top`, and the
    distributions its pyproject requires."""

    ref: str
    root: Path | None  # None: a standard-library module, nothing to upload
    top: str
    requires: tuple[str, ...]

    @property
    def remote_root(self) -> str:
        assert self.root is not None
        return f"{PKG_DIR}/{self.top}" if self.root.is_dir() else f"{PKG_DIR}/{self.top}.py"


def python_program(program: Any) -> PythonProgram:
    """The sandboxed form of a callable or `{"fn": ...}` program (ConfigError when it
    cannot be run by reference in a sandbox)."""
    fn = program["fn"] if isinstance(program, Mapping) else program
    if is_ref(fn):
        ref = fn
        resolve_ref(ref)  # importable here (ConfigError naming what is wrong)
    elif callable(fn):
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        if not module or module == "__main__" or "<" in qualname:
            raise ConfigError(f"a callable program runs in a sandbox by reference, so it must be a module-level "
                              f"function of an importable module (got {module}.{qualname}); "
                              'or use {"fn": "pkg.module:run"}')
        ref = f"{module}:{qualname}"
        if resolve_ref(ref) is not fn:
            raise ConfigError(f"program {ref} does not import back as the callable given")
    else:
        raise ConfigError(f'program fn must be "pkg.module:attr" or a callable, not {fn!r}')
    top = ref.partition(":")[0].split(".")[0]
    mod = importlib.import_module(top)
    file = getattr(mod, "__file__", None)
    if not file:
        raise ConfigError(f"program {ref}: its top-level module {top!r} has no file to upload (a namespace package?)")
    if hasattr(mod, "__path__"):
        root = Path(file).parent
        pyproject = root / "pyproject.toml"
    else:
        root = Path(file)
        pyproject = root.parent / "pyproject.toml"
    if root.resolve().is_relative_to(Path(sysconfig.get_paths()["stdlib"]).resolve()):
        return PythonProgram(ref=ref, root=None, top=top, requires=())  # the sandbox's Python has it
    return PythonProgram(ref=ref, root=root, top=top, requires=tuple(_dependencies(pyproject)))


def _dependencies(pyproject: Path) -> list[str]:
    if not pyproject.is_file():
        return []
    try:
        data = tomllib.loads(pyproject.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {pyproject}: {exc}") from exc
    names = []
    for req in (data.get("project") or {}).get("dependencies") or []:
        m = _REQ_NAME.match(str(req))
        if m:
            names.append(m.group(1))
    return names


async def install(sandbox: Any, prog: PythonProgram) -> None:
    """Upload the program's package and the runner into `sandbox`."""
    if prog.root is not None:
        await sandbox.upload(prog.root, prog.remote_root)
    await sandbox.write_file(RUNNER_PATH, RUNNER_SOURCE.read_text())


def _missing_error(prog: PythonProgram, missing: list[str], sandbox: Any) -> ConfigError:
    image = getattr(getattr(sandbox, "spec", None), "image", "?")
    return ConfigError(f"{prog.ref} requires {', '.join(missing)} (its pyproject's dependencies), not installed in "
                       f"sandbox image {image}; sandboxes have no network: use an image that has them")


async def call_in_sandbox(prog: PythonProgram, sandbox: Any, kwargs: dict[str, Any], timeout: float) -> Any:
    """One call `prog.ref(**kwargs)` in `sandbox` (a sandboxed toolset's tool): its JSON
    return value; what it raised comes back as a SandboxedProgramError (the model's
    feedback, like a host tool's exception)."""
    call = uuid.uuid4().hex
    spec_path, result_path = f"{BASE}/tool-{call}.spec.json", f"{BASE}/tool-{call}.result.json"
    await sandbox.write_file(spec_path, json.dumps({"ref": prog.ref, "kwargs": kwargs, "requires": list(prog.requires)},
                                                   default=str))
    res = await sandbox.exec(["python3", RUNNER_PATH, spec_path, result_path], env={"PYTHONPATH": PKG_DIR,
                             "PYTHONDONTWRITEBYTECODE": "1"}, timeout=timeout)
    try:
        result = json.loads(await sandbox.read_file(result_path))
    except PathError:
        what = f"timed out after {timeout:g}s" if res.timed_out else f"ended without a result: {res.stderr[-1000:]}"
        raise SandboxedProgramError(f"tool {prog.ref} {what}") from None
    if result.get("missing"):
        raise _missing_error(prog, result["missing"], sandbox)
    err = result.get("error")
    if err:
        raise SandboxedProgramError(f"{err['type']}: {err['message']}", err.get("traceback"))
    return result.get("value")


async def run_sandboxed_python(prog: PythonProgram, task: Mapping[str, Any], state: Any, program: Mapping[str, Any],
                               sandbox: Any, timeout: float, limit: int) -> None:
    """Run `prog` for this rollout in `sandbox` (see the module docstring)."""
    rid = state["trajectory_id"]
    spec_path, result_path = f"{BASE}/{rid}.spec.json", f"{BASE}/{rid}.result.json"
    await install(sandbox, prog)
    files = {**(program.get("files") or {}), **((task.get("program") or {}).get("files") or {})}
    for path, text in files.items():
        await sandbox.write_file(path, text)
    sent = {k: v for k, v in state.items() if k not in NOT_SENT}
    endpoint = state.get_endpoint_config()
    env = {"PYTHONPATH": PKG_DIR, "PYTHONDONTWRITEBYTECODE": "1"}
    env.update({k: str(v) for k, v in (program.get("env") or {}).items()})
    env.update({k: str(v) for k, v in ((task.get("program") or {}).get("env") or {}).items()})
    async with SandboxRelay(sandbox, endpoint["base_url"]) as relay:
        spec = {"ref": prog.ref, "task": dict(task), "state": sent, "requires": list(prog.requires),
                "endpoint": {**endpoint, "base_url": relay.base_url}, "max_turns": task.get("max_turns")}
        await sandbox.write_file(spec_path, json.dumps(spec, default=str))
        env.update(OPENAI_BASE_URL=relay.base_url, OPENAI_API_KEY=endpoint["api_key"], OPENAI_MODEL=endpoint["model"])
        res = await sandbox.exec(["python3", RUNNER_PATH, spec_path, result_path], env=env, cwd=program.get("cwd"),
                                 timeout=float(program.get("timeout", timeout)))
    record_result(state, res.exit_code, res.stdout, res.stderr, timed_out=res.timed_out, limit=limit,
                  completion_from_stdout=False)
    try:
        result = json.loads(await sandbox.read_file(result_path))
    except PathError:
        if res.timed_out:
            raise SandboxedProgramError(f"program {prog.ref} timed out after {program.get('timeout', timeout):g}s "
                                        "in its sandbox") from None
        raise SandboxedProgramError(f"program {prog.ref} ended without a result in its sandbox (exit code "
                                    f"{res.exit_code}): {res.stderr[-2000:]}") from None
    if result.get("missing"):
        raise _missing_error(prog, result["missing"], sandbox)
    for key, value in (result.get("fields") or {}).items():
        if key not in NOT_RETURNED and (key not in sent or sent[key] != value):
            state[key] = value
    if result.get("stop"):
        state.stop(result["stop"])
    err = result.get("error")
    if err:
        raise SandboxedProgramError(f"{err['type']}: {err['message']}", err.get("traceback"))
