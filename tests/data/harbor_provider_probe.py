"""Drives `VfHarborEnvironment` directly through Harbor's `BaseEnvironment` API (run by
tests/test_harbor_provider.py with .venv-harbor's Python: Harbor needs 3.12) and prints
one JSON object of what it observed; the test asserts on it.

    python harbor_provider_probe.py TASK_DIR WORK_DIR [key=value ...]   # options as --ek takes them
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from harbor.environments.base import BaseEnvironment
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from integrations.harbor_env import VfHarborEnvironment


async def probe(env: BaseEnvironment, work: Path) -> dict:
    out: dict = {}
    await env.start(force_build=False)
    try:
        r = await env.exec("pwd; id -un; echo \"$TASK_VAR $EXEC_VAR\"; echo err >&2; exit 3",
                           env={"EXEC_VAR": "from-exec"})
        out["exec"] = [r.return_code, r.stdout, r.stderr]
        r = await env.exec("pwd", cwd="/tmp")
        out["cwd"] = r.stdout.strip()
        r = await env.exec("id -un", user="root")
        out["as_root"] = r.stdout.strip()
        try:
            await env.exec("id -un", user="nobody")
            out["as_nobody"] = "ran"
        except Exception as exc:  # noqa: BLE001 - the probe reports what was raised
            out["as_nobody"] = type(exc).__name__
        try:
            await env.exec("sleep 30", timeout_sec=1)
            out["timeout"] = "no error"
        except RuntimeError as exc:
            out["timeout"] = str(exc)
        out["after_timeout"] = (await env.exec("echo alive")).stdout.strip()
        # a directory tree with a nested dir, an executable and a symlink, into an existing dir
        src = work / "src"
        (src / "sub").mkdir(parents=True)
        (src / "a.txt").write_text("a\n")
        (src / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
        os.chmod(src / "sub" / "run.sh", 0o755)
        os.symlink("a.txt", src / "link")
        await env.exec("mkdir -p /data && echo old > /data/keep.txt")
        await env.upload_dir(src, "/data")
        r = await env.exec("cat /data/keep.txt /data/a.txt; /data/sub/run.sh; readlink /data/link")
        out["upload_dir"] = r.stdout.split()
        single = work / "one.bin"
        single.write_bytes(bytes(range(256)))
        await env.upload_file(single, "/data/deep/er/one.bin")
        out["upload_file"] = (await env.exec("wc -c < /data/deep/er/one.bin")).stdout.strip()
        dest = work / "dest"
        dest.mkdir()
        (dest / "a.txt").write_text("stale\n")
        await env.download_dir("/data", dest)
        out["download_dir"] = {
            "a": (dest / "a.txt").read_text(), "keep": (dest / "keep.txt").read_text(),
            "exec_bit": os.access(dest / "sub" / "run.sh", os.X_OK), "link": os.readlink(dest / "link"),
            "bin": (dest / "deep" / "er" / "one.bin").read_bytes() == bytes(range(256))}
        await env.download_file("/data/deep/er/one.bin", work / "got" / "one.bin")
        out["download_file"] = (work / "got" / "one.bin").read_bytes() == bytes(range(256))
        out["is_dir"] = [await env.is_dir("/data"), await env.is_dir("/data/a.txt")]
        out["is_file"] = [await env.is_file("/data/a.txt"), await env.is_file("/nonexistent")]
        try:
            await env.download_file("/nonexistent", work / "x")
            out["download_missing"] = "no error"
        except Exception as exc:  # noqa: BLE001
            out["download_missing"] = type(exc).__name__
    finally:
        await env.stop(delete=True)
    try:
        await env.exec("true")
        out["after_stop"] = "ran"
    except RuntimeError as exc:
        out["after_stop"] = str(exc)
    return out


def main() -> None:
    task, work = Path(sys.argv[1]), Path(sys.argv[2])
    kwargs = {}
    for arg in sys.argv[3:]:  # as Harbor's --ek: a JSON value, else the string
        key, value = arg.split("=", 1)
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    trial = TrialPaths(work / "trial")
    trial.mkdir()
    env = VfHarborEnvironment(
        environment_dir=task / "environment", environment_name="probe", session_id="probe__env",
        trial_paths=trial, task_env_config=EnvironmentConfig(network_mode="no-network", memory_mb=512,
                                                             env={"TASK_VAR": "from-task"}),
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK), **kwargs)
    print(json.dumps(asyncio.run(probe(env, work))))


if __name__ == "__main__":
    main()
