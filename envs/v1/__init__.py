"""The v1 API: `Taskset` (rows + task-owned behaviour) and `Harness` (the
program that runs one task), packaged by `Env(taskset, harness)` for eval and
training; `Toolset` / `MCPTool` for tools; typed `Config` models.

    state = await harness.run(task)          # standalone
    env = vf.v1.Env(taskset, harness)         # as an environment
"""

from .config import (
    Config,
    EnvConfig,
    HarnessConfig,
    MCPToolConfig,
    SandboxConfig,
    TasksetConfig,
    ToolsetConfig,
    UserConfig,
    resolve_ref,
)
from .env import Env
from .harness import Harness
from .state import State
from .task import Task
from .taskset import Taskset
from .toolset import MCPTool, Toolset

__all__ = ["Config", "Env", "EnvConfig", "Harness", "HarnessConfig", "MCPTool", "MCPToolConfig", "SandboxConfig",
           "State", "Task", "Taskset", "TasksetConfig", "Toolset", "ToolsetConfig", "UserConfig", "resolve_ref"]
