"""A cancellation (SIGINT / SIGTERM stopping a run, a rollout cancelled by its
group) is never swallowed. Python 3.11's `asyncio.wait_for` returns the
inner result when the cancel and the result arrive in the same loop tick
(CPython gh-86296, fixed in 3.12): a rollout cancelled while its sandbox
was becoming ready went on into a 10-minute model call and held the stopped
run open. The project uses `asyncio.timeout` instead; this module checks
the source and the behaviour."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from source_tree import parse_file

from sandboxes.agent.client import AgentChannel, AgentConnection

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sandboxes", "backends", "envs", "runs", "runner", "hosted", "dashboard", "vfcli", "testmodel", "swe_debug", "benchmarks")


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_no_cancellation_swallowing_calls_in_the_source():
    """`asyncio.wait_for` (swallows a cancel on 3.11) and `suppress(CancelledError or
    BaseException)` (swallows the caller's own cancel too) are not used;
    `asyncio.timeout` and `sandboxes.cancel.cancel_and_settle` do those jobs."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = parse_file(path)
            for call in _calls(tree):
                name = _dotted(call.func)
                rel = f"{path.relative_to(ROOT)}:{call.lineno}"
                if name.endswith("wait_for") and name.split(".")[0] == "asyncio":
                    found.append(f"{rel}: asyncio.wait_for (use `async with asyncio.timeout(...)`)")
                if name.endswith("suppress") and any(_dotted(a).endswith(("CancelledError", "BaseException"))
                                                     for a in call.args):
                    found.append(f"{rel}: suppress({', '.join(map(_dotted, call.args))}) swallows the caller's "
                                 "cancellation too (use sandboxes.cancel.cancel_and_settle([task]))")
    assert not found, "\n".join(found)


class _SilentChannel(AgentChannel):
    """A channel that never says anything (the test resolves the hello itself)."""

    def __init__(self) -> None:
        self._closed = asyncio.Event()

    async def send(self, data: bytes) -> None:
        pass

    async def receive(self) -> bytes:
        await self._closed.wait()
        return b""

    async def close(self) -> None:
        self._closed.set()


async def test_agent_start_cancelled_as_the_hello_arrives_stays_cancelled():
    """The agent's hello and the caller's cancel land in the same tick: `start` raises
    CancelledError (with 3.11's wait_for it returned the hello and the rollout went on)."""
    conn = AgentConnection(_SilentChannel())
    task = asyncio.create_task(conn.start(timeout=30))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()
    conn._hello.set_result({"version": "test"})  # the hello the read loop would deliver
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await conn.close()


async def test_timeout_still_fires():
    """The replacement keeps the deadline: a hello that never comes is an AgentError."""
    from sandboxes.errors import AgentError

    conn = AgentConnection(_SilentChannel())
    with pytest.raises(AgentError, match="did not start within"):
        await conn.start(timeout=0.2)


async def test_a_rollout_that_swallows_its_cancel_is_cancelled_again(monkeypatch):
    """Defence in depth: a task that ignores the first cancel (as a rollout did under
    3.11's wait_for) is cancelled again, so a stopped group ends in seconds."""
    import envs.environment as environment
    import sandboxes.cancel

    monkeypatch.setattr(sandboxes.cancel, "RECANCEL_SECONDS", 0.1)
    swallowed = []

    async def stubborn():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            swallowed.append(1)  # a library bug: the cancel is lost, the rollout goes on
        await asyncio.sleep(60)  # the "10-minute model call"

    async def group():
        await environment.gather_or_cancel([stubborn(), asyncio.sleep(60)])

    task = asyncio.create_task(group())
    await asyncio.sleep(0.05)
    task.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert swallowed == [1]
