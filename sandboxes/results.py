"""Typed results that cross the sandbox boundary: exec results, output chunks,
background-process status and sandbox listings."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ExecResult(BaseModel):
    """What one command did. A non-zero exit or a timeout is a result, not an exception.

    Output is decoded as UTF-8 with replacement (binary output never raises).
    When a stream exceeded the output limit its head and tail are kept, the
    middle is dropped and `*_dropped_bytes` says how many bytes were cut.
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = Field(None, description="None when the command was killed before exiting on its own.")
    timed_out: bool = False
    signal: int | None = Field(None, description="Signal that ended the command, where known.")
    oom_killed: bool = Field(False, description="The command (or its sandbox) hit the memory limit, where known.")
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0
    duration: float = Field(0.0, description="Seconds from start to exit, measured inside the sandbox where possible.")
    start_error: str | None = Field(None, description="The command could not start: errno name (ENOENT: no such "
                                    "program, EACCES: not executable, ...); exit_code is then 127 / 126 as a shell says.")

    @property
    def truncated(self) -> bool:
        return bool(self.stdout_dropped_bytes or self.stderr_dropped_bytes)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout and stderr joined, for display to a model or a log."""
        if self.stdout and self.stderr:
            sep = "" if self.stdout.endswith("\n") else "\n"
            return self.stdout + sep + self.stderr
        return self.stdout or self.stderr


class OutputChunk(BaseModel):
    """A piece of output from a streaming exec, in arrival order."""

    stream: Literal["stdout", "stderr"]
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


class ProcessStatus(BaseModel):
    """State of a background process started with `Sandbox.start_process`."""

    pid: int
    running: bool
    exit_code: int | None = None
    signal: int | None = None


class SandboxInfo(BaseModel):
    """One row of a backend listing (`SandboxBackend.list`)."""

    id: str
    name: str
    backend: str
    status: str = Field(description="Backend's own status word: running, exited, pending, ...")
    image: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: float | None = Field(None, description="Unix time the sandbox was created.")
