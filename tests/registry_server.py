"""A real container registry for tests: Debian's `docker-registry` (the registry:2
server) on a free 127.0.0.1 port, with htpasswd (bcrypt) basic auth and its own
storage directory. The Docker engine trusts 127.0.0.0/8 registries over plain HTTP
by default, so no engine configuration is needed. Missing binaries fail the test
under VF_REQUIRE_DOCKER=1 (CI) and skip it otherwise."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import docker_required


@dataclass
class Registry:
    url: str  # host:port, as image names spell it
    username: str
    password: str
    proc: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_registry(root: Path) -> Registry:
    missing = [b for b in ("docker-registry", "htpasswd") if shutil.which(b) is None]
    if missing:
        msg = f"{', '.join(missing)} missing (scripts/setup.sh installs docker-registry and apache2-utils)"
        if docker_required():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    user, password = "vf-ci", f"vf-reg-{uuid.uuid4().hex}"
    htpasswd = subprocess.run(["htpasswd", "-Bbn", user, password], capture_output=True, text=True, check=True).stdout
    (root / "htpasswd").write_text(htpasswd)
    port = _free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: vf-test\n    path: {root / 'htpasswd'}\n")
    log = open(root / "registry.log", "wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:  # up, and asking for credentials
                return Registry(f"127.0.0.1:{port}", user, password, proc)
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the registry did not start: {(root / 'registry.log').read_text()[-2000:]}")


def stop_registry(reg: Registry) -> None:
    reg.proc.terminate()
    try:
        reg.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        reg.proc.kill()
