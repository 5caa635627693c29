"""A Harbor task directory, read into this stack: `load_tasks(path)` takes one task
(a directory with task.toml) or a directory of them (each child with a task.toml,
in name order) and returns the tasks plus the ones that could not be read.

Layout (Harbor's `TaskPaths`): task.toml, instruction.md, environment/Dockerfile
(or `[environment].docker_image`), tests/test.sh, solution/solve.sh (the oracle;
only the gate needs it). `HarborTask.unsupported()` names what this stack cannot
honour (multi-step tasks, Windows, a separate verifier container, GPUs/TPUs, MCP
servers, healthchecks, skills); such a task is refused with that reason, never run
with the feature silently dropped.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandboxes.errors import UsageError
from sandboxes.images import dockerfile_workdir

from .config import TaskConfig

CONFIG = "task.toml"


class TaskUnsupported(UsageError):
    """The task asks for something this stack (or this backend) cannot honour; the
    message says what. The task is refused, never run without it."""


class TaskLoadError(BaseModel):
    """A task directory that could not be read (its name, what went wrong)."""

    name: str
    path: str
    type: str
    message: str


class HarborTask(BaseModel):
    """One task: its directory, parsed config and instruction."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    path: Path
    name: str
    config: TaskConfig
    instruction: str

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def test_script(self) -> Path:
        return self.tests_dir / "test.sh"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def solve_script(self) -> Path:
        return self.solution_dir / "solve.sh"

    def unsupported(self) -> str | None:
        """Why this stack cannot run the task as Harbor would, or None."""
        c = self.config
        env = c.environment
        if c.steps:
            return "multi-step tasks ([[steps]]) are not supported"
        if env.os != "linux":
            return f"[environment].os = {env.os!r}: only linux tasks run here"
        if c.verifier.environment_mode == "separate" or c.verifier.environment is not None:
            return "a separate verifier environment ([verifier].environment / environment_mode='separate') is not supported"
        if env.gpus or env.tpu:
            return "GPUs / TPUs ([environment].gpus / tpu) are not supported"
        if env.mcp_servers:
            return "[environment].mcp_servers is not supported"
        if env.healthcheck is not None:
            return "[environment].healthcheck is not supported"
        if env.skills_dir:
            return "[environment].skills_dir is not supported"
        if env.docker_image is None and not self.dockerfile.is_file():
            return "no environment/Dockerfile and no [environment].docker_image"
        if (self.environment_dir / "docker-compose.yaml").exists() or (self.environment_dir / "docker-compose.yml").exists():
            return "environment/docker-compose.yaml (multi-container tasks) is not supported"
        return None

    def image_workdir(self) -> str | None:
        """The WORKDIR the task's Dockerfile leaves (its last one), if it sets one."""
        if not self.dockerfile.is_file():
            return None
        return dockerfile_workdir(self.dockerfile.read_text(errors="replace"))

    def workdir(self) -> str | None:
        """Where commands run: `[environment].workdir`, else the image's WORKDIR."""
        return self.config.environment.workdir or self.image_workdir()


def read_task(path: Path) -> HarborTask:
    """One task directory (ValueError / FileNotFoundError when it cannot be read)."""
    path = path.resolve()
    cfg_path = path / CONFIG
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG}")
    config = TaskConfig.from_toml(cfg_path.read_text())
    instruction_path = path / "instruction.md"
    if not instruction_path.is_file():
        raise FileNotFoundError(f"{path}: no instruction.md")
    if not (path / "tests" / "test.sh").is_file():
        raise FileNotFoundError(f"{path}: no tests/test.sh")
    name = path.name
    return HarborTask(path=path, name=name, config=config, instruction=instruction_path.read_text())


def task_dirs(path: str | Path) -> list[Path]:
    """The task directories under `path`: itself when it holds task.toml, else its
    children that do (name order). FileNotFoundError when there are none."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"Harbor tasks: no such directory: {p}")
    if (p / CONFIG).is_file():
        return [p]
    found = sorted(c for c in p.iterdir() if c.is_dir() and (c / CONFIG).is_file())
    if not found:
        raise FileNotFoundError(f"Harbor tasks: {p} holds no task (no {CONFIG} in it or its subdirectories)")
    return found


def load_tasks(path: str | Path, names: list[str] | None = None) -> tuple[list[HarborTask], list[TaskLoadError]]:
    """The tasks under `path` (optionally only `names`) and the ones that failed to load.
    FileNotFoundError when `path` holds no task or a name is not there."""
    dirs = task_dirs(path)
    if names:
        by_name = {d.name: d for d in dirs}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise FileNotFoundError(f"Harbor tasks: not in {path}: {', '.join(missing)}")
        dirs = [by_name[n] for n in names]
    tasks: list[HarborTask] = []
    errors: list[TaskLoadError] = []
    for d in dirs:
        try:
            tasks.append(read_task(d))
        except (ValueError, OSError) as exc:
            first = str(exc).strip().splitlines()
            msg = " ".join(line.strip() for line in first[:4])
            errors.append(TaskLoadError(name=d.name, path=str(d), type=type(exc).__name__, message=msg[:1000]))
    return tasks, errors
