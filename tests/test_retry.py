"""The retry policy really backs off (attempts counted, waits measured), retries
only InfraError (also wrapped), and a dead Docker daemon is a BackendUnavailable
naming the socket, retried under the policy."""

from __future__ import annotations

import socket
import time

import pytest

from sandboxes import BackendUnavailable, ConfigError, InfraError, RetryPolicy, SandboxSpec, retry_infra


class Flaky:
    def __init__(self, failures: int, exc: type[BaseException] = InfraError):
        self.failures, self.exc, self.times = failures, exc, []

    async def __call__(self):
        self.times.append(time.monotonic())
        if len(self.times) <= self.failures:
            raise self.exc(f"failure {len(self.times)}")
        return "done"


async def test_backs_off_exponentially():
    fn = Flaky(3)
    result, attempts = await retry_infra(fn, RetryPolicy(attempts=5, initial_delay=0.1, exp_base=2, jitter=0))
    assert (result, attempts) == ("done", 4)
    gaps = [b - a for a, b in zip(fn.times, fn.times[1:])]
    for gap, want in zip(gaps, [0.1, 0.2, 0.4]):
        assert want * 0.9 <= gap < want + 0.5, gaps
    assert gaps[0] < gaps[1] < gaps[2], gaps


async def test_jitter_and_cap():
    fn = Flaky(3)
    await retry_infra(fn, RetryPolicy(attempts=4, initial_delay=0.05, exp_base=10, max_delay=0.12, jitter=0.05))
    gaps = [b - a for a, b in zip(fn.times, fn.times[1:])]
    assert all(0.045 <= g <= 0.12 + 0.1 for g in gaps), gaps


async def test_gives_up_after_attempts_with_last_error():
    fn = Flaky(10)
    with pytest.raises(InfraError, match="failure 3"):
        await retry_infra(fn, RetryPolicy(attempts=3, initial_delay=0.01, jitter=0))
    assert len(fn.times) == 3


async def test_usage_errors_are_not_retried():
    fn = Flaky(1, ConfigError)
    with pytest.raises(ConfigError):
        await retry_infra(fn, RetryPolicy(attempts=5, initial_delay=0.01))
    assert len(fn.times) == 1


async def test_wrapped_infra_error_is_retried():
    calls = []

    async def fn():
        calls.append(1)
        if len(calls) < 2:
            try:
                raise BackendUnavailable("daemon")
            except BackendUnavailable as exc:
                raise RuntimeError("a tool wrapped it") from exc
        return "ok"

    assert await retry_infra(fn, RetryPolicy(attempts=3, initial_delay=0.01, jitter=0)) == ("ok", 2)


def _refusing_socket(tmp_path) -> str:
    path = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens: connection refused
    return str(path)


@pytest.mark.parametrize("where", ["missing", "refusing", "tcp"])
async def test_daemon_down_is_backend_unavailable_and_retried(where, tmp_path):
    from backends.docker import DockerBackend

    url = {"missing": f"unix://{tmp_path}/no-such.sock", "refusing": f"unix://{_refusing_socket(tmp_path)}",
           "tcp": "tcp://127.0.0.1:9"}[where]
    be = DockerBackend(url=url, retry=RetryPolicy(attempts=3, initial_delay=0.1, exp_base=2, jitter=0))
    attempts = []
    real = be._create_attempt

    async def counted(spec, name, *more):
        attempts.append(time.monotonic())
        return await real(spec, name, *more)

    be._create_attempt = counted
    try:
        with pytest.raises(BackendUnavailable) as info:
            await be.create(SandboxSpec())
    finally:
        await be.close()
    where_tried = url.split("://", 1)[1]
    assert where_tried in str(info.value)
    assert len(attempts) == 3
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.18, gaps


async def test_ping_and_list_on_dead_daemon(tmp_path):
    from backends.docker import DockerBackend, ping_sync

    url = f"unix://{tmp_path}/none.sock"
    assert "none.sock" in ping_sync(url)
    be = DockerBackend(url=url)
    with pytest.raises(BackendUnavailable, match="none.sock"):
        await be.ping()
    with pytest.raises(BackendUnavailable):
        await be.list()
    await be.close()
