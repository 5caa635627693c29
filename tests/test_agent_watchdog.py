"""A call whose channel never answers (the exec proxy outlived a removed sandbox, as
under gVisor) is failed with SandboxNotRunning once the backend says the sandbox is
gone; while the sandbox is there, the watchdog only asks again and the call goes on."""

from __future__ import annotations

import asyncio
import json

import pytest

from sandboxes.agent import client as agent_client
from sandboxes.agent.client import AgentChannel, AgentSandbox
from sandboxes.errors import InfraError, SandboxNotRunning
from sandboxes.spec import SandboxSpec


class SilentChannel(AgentChannel):
    """Says hello, then swallows every request: the stream stays open and mute."""

    def __init__(self) -> None:
        self.out: asyncio.Queue[bytes] = asyncio.Queue()
        self.out.put_nowait(json.dumps({"id": 0, "ev": "hello", "version": 1}).encode() + b"\n")

    async def send(self, data: bytes) -> None:
        pass

    async def receive(self) -> bytes:
        return await self.out.get()

    async def close(self) -> None:
        self.out.put_nowait(b"")


class Probed(AgentSandbox):
    def __init__(self, *a, gone_after: int, **kw) -> None:
        super().__init__(*a, **kw)
        self.probes = 0
        self.gone_after = gone_after

    async def gone(self) -> bool:
        self.probes += 1
        return self.probes >= self.gone_after


@pytest.fixture
def fast_probes(monkeypatch):
    monkeypatch.setattr(agent_client, "PROBE_AFTER", 0.05)
    monkeypatch.setattr(agent_client, "PROBE_EVERY", 0.05)


async def test_a_mute_call_fails_typed_once_the_sandbox_is_gone(fast_probes):
    sb = await Probed.connect(SilentChannel(), id="x", name="x", spec=SandboxSpec(image="i"), gone_after=3)
    with pytest.raises(SandboxNotRunning, match="removed behind this handle") as info:
        await asyncio.wait_for(sb.exec("echo ghost"), 5)
    assert isinstance(info.value, InfraError)
    assert sb.probes == 3  # asked again while the sandbox was still there, failed when it was gone
    await sb.connection.close()


async def test_without_a_backend_answer_the_call_keeps_waiting(fast_probes):
    sb = await Probed.connect(SilentChannel(), id="y", name="y", spec=SandboxSpec(image="i"), gone_after=10**9)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(sb.exec("sleep 100"), 0.5)
    assert sb.probes >= 3
    await sb.connection.close()


async def test_a_mute_stream_fails_typed_once_the_sandbox_is_gone(fast_probes):
    """File transfers and streamed execs are requests too: the same watchdog covers them."""
    sb = await Probed.connect(SilentChannel(), id="z", name="z", spec=SandboxSpec(image="i"), gone_after=2)
    with pytest.raises(SandboxNotRunning, match="removed behind this handle"):
        await asyncio.wait_for(sb.read_file("/etc/hostname"), 5)
    await sb.connection.close()
