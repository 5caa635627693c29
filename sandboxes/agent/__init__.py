"""The in-sandbox agent (`program.py`, stdlib-only, runs inside the sandbox),
its wire protocol (`protocol.py`) and the host-side `AgentSandbox` that any
backend reuses by supplying an `AgentChannel` (`client.py`, see its docstring)."""

from .client import AgentChannel, AgentConnection, AgentProcess, AgentSandbox, exec_result
from .protocol import PROTOCOL_VERSION, agent_argv, agent_source

__all__ = ["AgentChannel", "AgentConnection", "AgentProcess", "AgentSandbox", "exec_result",
           "PROTOCOL_VERSION", "agent_argv", "agent_source"]
