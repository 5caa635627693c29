"""isolation = "gvisor": what each backend does with it, on the real engine for Docker
(the engine's `runsc` runtime, registered by scripts/setup.sh), against the contract
fakes for Kubernetes and Prime. The conformance suite also runs under gVisor
(`docker-gvisor` in tests/test_conformance.py); the examples and a SWE instance run
under it in tests/test_gvisor_e2e.py."""

from __future__ import annotations

import json
import subprocess

import pytest

from backends.docker import DockerBackend
from backends.kubernetes import KubernetesConfig
from backends.kubernetes import manifest as mf
from backends.local import LocalBackend
from conftest import DEFAULT_TEST_IMAGE, TEST_LABELS, require_gvisor
from sandboxes import ConfigError, SandboxSpec

pytestmark = pytest.mark.docker


def _spec(**kw) -> SandboxSpec:
    kw["labels"] = {**TEST_LABELS, **kw.get("labels", {})}
    return SandboxSpec(image=DEFAULT_TEST_IMAGE, memory_gb=1, timeout_minutes=5, **kw)


def _runtime_of(container_id: str) -> str:
    out = subprocess.run(["docker", "inspect", "-f", "{{.HostConfig.Runtime}}", container_id], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def _containers(label: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True, check=True)
    return out.stdout.split()


async def test_gvisor_sandbox_runs_on_runsc_with_one_persistent_agent():
    """The container runs under runsc (its kernel is gVisor's, not the host's), and every
    command is served by the same agent process: one round trip, not a new process tree."""
    require_gvisor()
    backend = DockerBackend()
    try:
        gv = await backend.create(_spec(isolation="gvisor"))
        rc = await backend.create(_spec())
        try:
            assert _runtime_of(gv.id) == "runsc" and _runtime_of(rc.id) == "runc"
            host_kernel = open("/proc/version").read().strip()
            assert (await rc.exec("cat /proc/version")).stdout.strip() == host_kernel
            assert (await gv.exec("cat /proc/version")).stdout.strip() != host_kernel
            parents = {(await gv.exec("echo $PPID")).stdout for _ in range(3)}
            assert len(parents) == 1, parents  # the agent forks each command; the agent stays
            assert (await gv.exec("exit 3")).exit_code == 3
        finally:
            await gv.delete()
            await rc.delete()
    finally:
        await backend.close()


async def test_engine_without_the_runtime_is_a_clear_config_error_and_creates_nothing():
    label = "vf-gvisor-test=missing-runtime"
    backend = DockerBackend(gvisor_runtime="vf-no-such-runtime")
    try:
        with pytest.raises(ConfigError) as err:
            await backend.create(_spec(isolation="gvisor", labels={"vf-gvisor-test": "missing-runtime"}))
        msg = str(err.value)
        assert "'vf-no-such-runtime'" in msg and "daemon.json" in msg and "runsc" in msg and "kill -HUP" in msg
        assert _containers(label) == []
    finally:
        await backend.close()


async def test_network_with_gvisor_is_refused_when_the_runtime_has_no_network():
    require_gvisor()
    backend = DockerBackend()
    try:
        with pytest.raises(ConfigError, match="--network=none"):
            await backend.create(_spec(isolation="gvisor", network=True))
    finally:
        await backend.close()


async def test_local_backend_refuses_gvisor(tmp_path):
    backend = LocalBackend(base_dir=str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="not available on the local backend"):
            await backend.create(SandboxSpec(isolation="gvisor"))
    finally:
        await backend.close()


async def test_prime_backend_refuses_gvisor(tmp_path, monkeypatch):
    pytest.importorskip("prime_sandboxes", reason="the prime extra is not installed")
    from backends.prime import PrimeBackend
    from fakes.prime_server import FakePrime

    monkeypatch.setenv("HOME", str(tmp_path))
    async with FakePrime() as fake:
        backend = PrimeBackend(api_key=fake.api_key, base_url=fake.url)
        try:
            with pytest.raises(ConfigError, match="not available on the prime backend"):
                await backend.create(SandboxSpec(isolation="gvisor"))
            assert await backend.list() == []
        finally:
            await backend.close()


def test_kubernetes_pod_gets_the_gvisor_runtime_class():
    gv = mf.pod_manifest(SandboxSpec(isolation="gvisor"), KubernetesConfig(), "p", {})
    assert gv["spec"]["runtimeClassName"] == "gvisor"
    assert mf.spec_of(gv).isolation == "gvisor"
    named = mf.pod_manifest(SandboxSpec(isolation="gvisor"), KubernetesConfig(gvisor_runtime_class="gvisor-ptrace",
                                                                               runtime_class_name="kata"), "p", {})
    assert named["spec"]["runtimeClassName"] == "gvisor-ptrace"
    assert "runtimeClassName" not in mf.pod_manifest(SandboxSpec(), KubernetesConfig(runtime_class_name=None), "p", {})["spec"]


def test_isolation_is_validated_on_the_spec():
    with pytest.raises(ValueError):
        SandboxSpec(isolation="kata")


async def test_known_limit_of_debians_runsc_coreutils_ls():
    """Pinned so that the docs stay true: Debian bookworm's runsc (0.0~20221219)
    rejects statx(AT_NO_AUTOMOUNT) with EINVAL, so coreutils >= 9 `ls`/`stat` fail inside
    gVisor sandboxes while `find`, `cat`, Python and git work. When this test fails the
    engine's runsc is newer: drop the limit from docs/gvisor.md and docs/known-limits.md."""
    require_gvisor()
    version = subprocess.run(["runsc", "--version"], capture_output=True, text=True).stdout
    backend = DockerBackend()
    try:
        sb = await backend.create(_spec(isolation="gvisor"))
        try:
            ls = await sb.exec("ls /tmp")
            find = await sb.exec("find /tmp -maxdepth 0; python3 -c 'import os; os.stat(\"/tmp\")'")
            assert find.exit_code == 0
            if "20221219" in version:
                assert ls.exit_code != 0 and "Invalid argument" in ls.stderr, (version, ls)
            else:
                pytest.fail(f"runsc is not Debian's 20221219 ({version.splitlines()[0]}); `ls` exit {ls.exit_code}: "
                            "update the known-limit note in docs/gvisor.md, docs/known-limits.md and this test")
        finally:
            await sb.delete()
    finally:
        await backend.close()


def test_conftest_reads_the_engine_runtimes():
    out = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True, check=True)
    runtimes = json.loads(out.stdout)
    assert "runc" in runtimes
