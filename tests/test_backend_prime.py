"""Prime backend specifics: the missing-key error, the request built from a
spec, the SDK error mapping, and behaviour against the contract fake of the
Prime API through the real SDK (402, image pull, OOM / lifetime timeout,
idempotent create, creation rate limit, labels)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

pytest.importorskip("prime_sandboxes", reason="the prime extra is not installed")

from prime_sandboxes import exceptions as pe  # noqa: E402
from prime_sandboxes.core import client as pc  # noqa: E402

from backends.prime import (  # noqa: E402
    PrimeBackend,
    PrimeImagePullError,
    PrimeOOMKilled,
    PrimePaymentRequired,
    PrimeSandboxTimeout,
    map_error,
)
from backends.prime.backend import _labels_in, _labels_out  # noqa: E402
from backend_harness import check_cancelled_create_does_not_leak, check_reaper_deletes_expired_and_old  # noqa: E402
from fakes.prime_server import FakePrime  # noqa: E402
from sandboxes import (  # noqa: E402
    BackendUnavailable,
    ConfigError,
    InfraError,
    SandboxCreateError,
    SandboxNotRunning,
    SandboxSpec,
    UsageError,
    get_backend,
    is_infra_error,
)
from sandboxes import labels as lc  # noqa: E402


def test_missing_api_key_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.prime/config.json
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="PRIME_API_KEY"):
        get_backend("prime")
    monkeypatch.setenv("PRIME_API_KEY", "k")
    assert get_backend("prime").name == "prime"


def test_key_and_team_precedence(monkeypatch, tmp_path):
    """api key: option > $PRIME_API_KEY > ~/.prime/config.json; team: option >
    $PRIME_TEAM_ID > ~/.prime/config.json > none (the documented default was never read)."""
    import json

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    monkeypatch.delenv("PRIME_TEAM_ID", raising=False)
    spec = SandboxSpec(image="img:1")
    assert PrimeBackend(api_key="k")._request(spec, "x").team_id is None
    (tmp_path / ".prime").mkdir()
    (tmp_path / ".prime" / "config.json").write_text(json.dumps({"api_key": "file-key", "team_id": "file-team"}))
    be = PrimeBackend()
    assert be._api_key == "file-key" and be._request(spec, "x").team_id == "file-team"
    monkeypatch.setenv("PRIME_API_KEY", "env-key")
    monkeypatch.setenv("PRIME_TEAM_ID", "env-team")
    be = PrimeBackend()
    assert be._api_key == "env-key" and be._request(spec, "x").team_id == "env-team"
    assert PrimeBackend(api_key="k", team_id="opt-team")._request(spec, "x").team_id == "opt-team"


def test_request_from_spec():
    be = PrimeBackend(api_key="k")
    spec = SandboxSpec(image="img:1", cpu_cores=2, memory_gb=4, disk_size_gb=10, timeout_minutes=1.5,
                       environment_vars={"A": "1"}, labels={"task": "t1"}, start_command="sleep 1d")
    req = be._request(spec, "key-1")
    assert (req.docker_image, req.cpu_cores, req.memory_gb, req.disk_size_gb) == ("img:1", 2, 4, 10)
    assert req.timeout_minutes == 2 and req.environment_vars == {"A": "1"}
    assert req.start_command.executable == "/bin/sh" and req.start_command.args == ["-c", "sleep 1d"]
    assert req.idempotency_key == "key-1" and req.network_denylist == ["0.0.0.0/0"]
    labels = _labels_in(req.labels)
    assert labels["task"] == "t1" and labels[lc.MANAGED] == "true" and lc.RUN_ID in labels
    assert be._request(spec.model_copy(update={"network": True}), "k").network_denylist is None
    with pytest.raises(ConfigError, match="gpu_type"):
        be._request(spec.model_copy(update={"gpu_count": 1}), "k")
    assert PrimeBackend(api_key="k", gpu_type="H100")._request(spec.model_copy(update={"gpu_count": 1}), "k").gpu_type == "H100"
    assert _labels_in(_labels_out({"a": "b=c", "d": ""})) == {"a": "b=c", "d": ""}


def _http_error(status: int) -> Exception:
    req = httpx.Request("GET", "http://x")
    try:
        raise httpx.HTTPStatusError("boom", request=req, response=httpx.Response(status, request=req))
    except httpx.HTTPStatusError as cause:
        try:
            raise pc.APIError(f"HTTP {status}: boom") from cause
        except pc.APIError as e:
            return e


@pytest.mark.parametrize("exc,expected,infra", [
    (pe.SandboxOOMError("s", "ERROR", "OOM_KILLED"), PrimeOOMKilled, True),
    (pe.SandboxTimeoutError("s", "TIMEOUT", "TIMEOUT"), PrimeSandboxTimeout, True),
    (pe.SandboxImagePullError("s", "ERROR", "IMAGE_PULL_FAILED"), PrimeImagePullError, True),
    (pe.SandboxNotRunningError("s", "TERMINATED"), SandboxNotRunning, True),
    (pc.PaymentRequiredError("Payment required"), PrimePaymentRequired, False),
    (pc.UnauthorizedError("no"), ConfigError, False),
    (_http_error(409), SandboxNotRunning, True),
    (_http_error(404), SandboxNotRunning, True),
    (_http_error(422), ConfigError, False),
    (_http_error(503), BackendUnavailable, True),
    (pc.APITimeoutError("slow"), BackendUnavailable, True),
])
def test_sdk_errors_map_onto_the_hierarchy(exc, expected, infra):
    got = map_error(exc, "doing x")
    assert isinstance(got, expected) and is_infra_error(got) == infra
    assert "doing x" in str(got)


@pytest.fixture
async def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the SDK caches gateway tokens under ~/.prime
    async with FakePrime() as f:
        yield f


@pytest.fixture
async def backend(fake):
    be = PrimeBackend(api_key=fake.api_key, base_url=fake.url)
    yield be
    await be.delete_many()
    await be.close()


async def test_payment_required_is_not_retryable(backend, fake):
    fake.payment_required = True
    with pytest.raises(PrimePaymentRequired) as e:
        await backend.create(SandboxSpec())
    assert isinstance(e.value, UsageError) and not is_infra_error(e.value)


async def test_image_pull_failure_is_a_create_error_and_leaves_nothing(backend, fake):
    with pytest.raises(PrimeImagePullError, match="not found") as e:
        await backend.create(SandboxSpec(image="nope/imagepull:1"))
    assert isinstance(e.value, SandboxCreateError)
    assert fake.sandboxes == {}


async def test_sandbox_death_raises_typed_errors(backend, fake):
    a = await backend.create(SandboxSpec())
    b = await backend.create(SandboxSpec())
    await fake.oom_kill(a.id)
    with pytest.raises(PrimeOOMKilled):
        await a.exec("echo x")
    await fake.time_out(b.id)
    with pytest.raises(PrimeSandboxTimeout):
        await b.read_file("/etc/hostname")
    assert not await a.alive() and not await b.alive()
    with pytest.raises(InfraError):
        await backend.get(a.id)


async def test_idempotent_create(backend, fake):
    a = await backend.create(SandboxSpec(), idempotency_key="rollout-1")
    b = await backend.create(SandboxSpec(), idempotency_key="rollout-1")
    assert a.id == b.id and len(fake.sandboxes) == 1
    await b.connection.close()
    await a.delete()


async def test_cancelled_create_does_not_leak(backend, fake):
    await check_cancelled_create_does_not_leak(backend, lambda: fake.sandboxes, lambda: fake.sandboxes)


async def test_creation_rate_limit(fake):
    be = PrimeBackend(api_key=fake.api_key, base_url=fake.url, creates_per_minute=600, create_burst=1)
    t0 = time.monotonic()
    made = await asyncio.gather(*(be.create(SandboxSpec()) for _ in range(3)))
    assert time.monotonic() - t0 >= 2 / 10 * 0.9
    for s in made:
        await s.delete()
    await be.close()


async def test_labels_round_trip_and_bulk_delete_by_label(backend, fake):
    a = await backend.create(SandboxSpec(labels={"exp": "e1", "odd": "a=b"}))
    await backend.create(SandboxSpec(labels={"exp": "e2"}))
    [info] = await backend.list({"exp": "e1"})
    assert info.id == a.id and info.labels["odd"] == "a=b" and info.backend == "prime"
    assert await backend.delete_many(labels={"exp": "e1"}) == 1
    assert [i.labels["exp"] for i in await backend.list()] == ["e2"]


async def test_lifecycle_cleanup_deletes_tracked_sandboxes_synchronously(backend, fake):
    from sandboxes import lifecycle

    sb = await backend.create(SandboxSpec())
    assert sb.id in lifecycle.live()
    assert await asyncio.to_thread(lifecycle.cleanup_all) >= 1  # blocking remover, off the fake's loop
    assert fake.sandboxes == {}
    other = await backend.create(SandboxSpec())
    await other.delete()
    assert other.id not in lifecycle.live()


async def test_stream_broken_by_sandbox_death_is_typed(backend, fake):
    sb = await backend.create(SandboxSpec())
    stream = sb.exec_stream("echo first; sleep 30")
    first = await stream.__anext__()
    assert first.data == b"first\n"
    await fake.oom_kill(sb.id)
    with pytest.raises(PrimeOOMKilled) as e:
        async for _ in stream:
            pass
    assert isinstance(e.value.__cause__, Exception)
    await sb.delete()


async def test_reaper_deletes_expired_sandboxes(backend, fake):
    await check_reaper_deletes_expired_and_old(backend, lambda: fake.sandboxes)
