"""`SandboxSpec.user_switch` on the real Docker engine: exec(user=) switches users while
no command ever holds a capability.

The container gets exactly CAP_SETUID, CAP_SETGID and CAP_SETPCAP (no-new-privileges on);
the agent keeps them, every command it starts sheds them before exec: a switched user by
the kernel's uid change (and a bounding set without them), a root command by dropping
them from its bounding, effective, permitted and inheritable sets. The default spec keeps
refusing another user with UserSwitchUnsupported; cells and other backends refuse the
option itself.
"""

from __future__ import annotations

import pytest

from conftest import TEST_LABELS, leftover_containers, require_gvisor

pytestmark = pytest.mark.docker

CAPS = "grep -E '^Cap(Eff|Prm|Bnd|Inh|Amb):' /proc/self/status"


def caps(stdout: str) -> dict[str, int]:
    out = {}
    for line in stdout.splitlines():
        key, value = line.split(":")
        out[key] = int(value.strip(), 16)
    assert {"CapEff", "CapPrm", "CapBnd", "CapInh"} <= set(out), stdout  # gVisor has no CapAmb line
    return out


@pytest.fixture
def switch_spec(docker_spec):
    return docker_spec.model_copy(update={"user_switch": True, "labels": {**TEST_LABELS, "vf-test-user-switch": "1"}})


@pytest.mark.parametrize("isolation", ["runc", "gvisor"])
async def test_switched_user_and_root_commands_hold_no_capability(docker_backend, switch_spec, isolation):
    if isolation == "gvisor":
        require_gvisor()
    async with await docker_backend.create(switch_spec.model_copy(update={"isolation": isolation})) as sb:
        inspect = await (await docker_backend._client()).containers.get(sb.id)
        host = inspect["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == ["CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID"] \
            or sorted(host["CapAdd"]) == ["SETGID", "SETPCAP", "SETUID"], host["CapAdd"]
        assert "no-new-privileges" in host["SecurityOpt"]

        me = await sb.exec(["id", "-u"])
        assert me.ok and me.stdout.strip() == "0", me
        other = await sb.exec(["sh", "-c", "id -u; id -g; echo $HOME"], user="nobody")
        assert other.ok and other.stdout.split() == ["65534", "65534", "/nonexistent"], other
        by_uid = await sb.exec(["id", "-u"], user="1234:1234")
        assert by_uid.ok and by_uid.stdout.strip() == "1234", by_uid

        switched = caps((await sb.exec(["sh", "-c", CAPS], user="nobody")).stdout)
        root = caps((await sb.exec(["sh", "-c", CAPS])).stdout)
        assert switched == dict.fromkeys(switched, 0), switched
        assert root == dict.fromkeys(root, 0), root
        # a background process sheds them the same way
        proc = await sb.start_process(["sh", "-c", CAPS])
        await proc.wait(timeout=10)
        assert caps((await proc.read_output())[0]) == dict.fromkeys(root, 0)

        # a root command cannot become another user and back, nor gain anything from a setuid file
        setuid = await sb.exec(["python3", "-c", "import os\ntry:\n os.setuid(1000)\nexcept OSError as e:\n"
                                " print('refused', e.errno)\nelse:\n print('switched')\n try:\n  os.setuid(0)\n"
                                " except OSError as e:\n  print('no way back', e.errno)\n else:\n  print('ROOT AGAIN')"])
        assert setuid.ok and setuid.stdout.strip() == "refused 1", setuid
        made = await sb.exec(["sh", "-c", "cp \"$(command -v python3)\" /tmp/suidpy && chmod 4755 /tmp/suidpy "
                                          "&& python3 -c 'import os; print(oct(os.stat(\"/tmp/suidpy\").st_mode & 0o7777)[2:])'"])
        assert made.ok and made.stdout.strip() == "4755", made
        gained = await sb.exec(["/tmp/suidpy", "-c", "import os; print(os.geteuid())"], user="nobody")
        assert gained.ok and gained.stdout.strip() == "65534", gained
        su = await sb.exec(["sh", "-c", "su -c id root </dev/null"], user="nobody")
        assert not su.ok and "uid=0" not in su.stdout, su
        # the agent itself still switches after all that
        again = await sb.exec(["id", "-u"], user="nobody")
        assert again.ok and again.stdout.strip() == "65534", again
    assert leftover_containers({"vf-test-user-switch": "1"}) == []


async def test_default_spec_still_refuses(docker_sandbox):
    from sandboxes import UserSwitchUnsupported

    with pytest.raises(UserSwitchUnsupported, match="cannot switch users"):
        await docker_sandbox.exec(["id", "-u"], user="nobody")
    assert caps((await docker_sandbox.exec(["sh", "-c", CAPS])).stdout)["CapEff"] == 0


async def test_cells_and_non_root_agent_refuse_it(docker_backend, switch_spec):
    from sandboxes import ConfigError

    with pytest.raises(ConfigError, match="not available in cells"):
        await docker_backend.create(switch_spec.model_copy(update={"rollout_isolation": "namespace"}))
    with pytest.raises(ConfigError, match="agent to run as root"):
        await docker_backend.create(switch_spec.model_copy(update={"user": "nobody"}))


async def test_other_backends_refuse_it():
    from sandboxes import ConfigError, SandboxSpec, get_backend

    backend = get_backend("local")
    try:
        with pytest.raises(ConfigError, match="only the docker backend"):
            await backend.create(SandboxSpec(user_switch=True))
    finally:
        await backend.close()
