"""The process environment is read at the point of use, never at import, and every
`VF_*` variable the package reads is listed in `sandboxes.settings` (docs/settings.md
is rendered from it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from sandboxes.settings import ProcessSettings, reference_markdown

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sandboxes", "backends", "envs", "runs", "runner", "hosted", "dashboard", "vfcli", "testmodel", "swe_debug")
# source text shipped into sandboxes, not importable on its own (glued onto the agent's source)
NOT_MODULES = {"sandboxes.agent.cells_program"}

# Runs in a fresh interpreter: os.environ becomes a spy that records every read whose
# innermost running module body (`<module>` frame) is one of ours: a read by our
# top-level code, directly or through anything it calls (Path.home() included). Reads
# by a third-party module's own import-time code are that module's, not ours.
SPY = r"""
import importlib, json, os, pkgutil, sys
ROOTS = tuple(os.path.join(sys.argv[1], p) + os.sep for p in sys.argv[2:])
reads = []

import sysconfig
STDLIB = (sysconfig.get_paths()["stdlib"] + os.sep,)  # (a venv's platstdlib holds site-packages)

def caller():
    # the innermost running module body must be ours, and the code asking must be ours
    # or the standard library acting for it (Path.home()); a library's own check while
    # our module defines something (pydantic reading PYDANTIC_DISABLE_PLUGINS when a
    # model class is made) is the library's, not a setting of ours
    f, asker = sys._getframe(2), None
    while f is not None:
        name = f.f_code.co_filename
        if asker is None and not (name.startswith(STDLIB) or name.startswith("<frozen") or name == "<string>"):
            asker = name
        if f.f_code.co_name == "<module>":
            return name if name.startswith(ROOTS) and asker is not None and asker.startswith(ROOTS) else None
        f = f.f_back
    return None

class Spy(type(os.environ)):
    def _note(self, what):
        where = caller()
        if where is not None:
            reads.append([what, where])
    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)
    def __iter__(self):
        self._note("<iteration>")
        return super().__iter__()
    def __len__(self):
        self._note("<len>")
        return super().__len__()
    def copy(self):
        self._note("<copy>")
        return super().copy()

e = os.environ
os.environ = Spy(e._data, e.encodekey, e.decodekey, e.encodevalue, e.decodevalue)
failed = {}
for pkg in sys.argv[2:]:
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # a program's entry point, not a module to import
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            failed[info.name] = repr(exc)
print(json.dumps({"reads": reads, "failed": failed, "modules": len(sys.modules)}))
"""


def test_no_module_reads_the_environment_at_import():
    proc = subprocess.run([sys.executable, "-c", SPY, str(ROOT), *PACKAGES], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = {m: e for m, e in out["failed"].items() if m not in NOT_MODULES}
    assert not failed, f"modules that cannot be imported: {failed}"
    reads = sorted({(what, str(Path(where).relative_to(ROOT))) for what, where in out["reads"]})
    assert not reads, "read from os.environ at import time (move it to the point of use or " \
                      f"sandboxes.settings): {reads}"


def test_the_spy_sees_an_import_time_read(tmp_path):
    """The check above can fail: a module reading the environment at import is caught."""
    pkg = tmp_path / "probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import os\nHOME = os.environ.get('VF_PROBE', 'x')\n")
    proc = subprocess.run([sys.executable, "-c", SPY, str(tmp_path), "probe_pkg"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r[0] for r in out["reads"]] == ["VF_PROBE"]


def test_every_vf_variable_the_package_reads_is_a_setting():
    """Each `VF_*` name in the package's source is a ProcessSettings field or listed as one
    vf-sandbox sets for its programs."""
    from sandboxes.settings import SET_FOR_PROGRAMS

    known = {ProcessSettings.variable(f) for f in ProcessSettings.model_fields}
    known |= {v.strip() for names in SET_FOR_PROGRAMS for v in names.split(",")}
    known |= {"VF_TEST_EXIT_CODE"}  # a shell variable of the SWE test command, not the environment
    found: dict[str, str] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for name in re.findall(r"\bVF_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
                found.setdefault(name, str(path.relative_to(ROOT)))
    unknown = {n: p for n, p in found.items() if n not in known}
    assert not unknown, f"VF_* variables not listed in sandboxes/settings.py: {unknown}"


def test_from_env_reads_only_what_it_is_given():
    s = ProcessSettings.from_env({"VF_SANDBOX_CACHE": "/c", "VF_SWE_PIP": "", "OTHER": "x"})
    assert s.cache_root() == Path("/c") and s.wheelhouse_root() == Path("/c/wheelhouse")
    assert s.swe_pip is None  # empty means unset
    assert ProcessSettings.from_env({"VF_SANDBOX_WHEELHOUSE": "/w"}).wheelhouse_root() == Path("/w")
    assert "secret" not in repr(ProcessSettings.from_env({"VF_REGISTRY_PASSWORD": "secret"}))


def test_docs_settings_page_is_current():
    assert reference_markdown() in (ROOT / "docs" / "settings.md").read_text(), \
        "docs/settings.md is out of date: paste sandboxes.settings.reference_markdown() into it"


def test_one_wheelhouse_for_every_image_kind(tmp_path, monkeypatch):
    """Derived/recipe images, OpenEnv and SWE layers download into the same root, one
    directory per request, written once (a second ask is a lookup, no pip run)."""
    import asyncio

    from backends.docker import images as docker_images
    from envs.openenv import build as openenv_build
    from sandboxes import wheels
    from swe_debug.images import ImageBuilder
    from swe_debug.instances import EnvironmentSpec

    monkeypatch.setenv("VF_SANDBOX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VF_SANDBOX_WHEELHOUSE", raising=False)
    monkeypatch.delenv("VF_SWE_CACHE", raising=False)
    calls: list[list[str]] = []

    def fake_run(argv, **kw):
        calls.append(argv)
        dest = Path(argv[argv.index("-d") + 1])
        (dest / f"pkg{len(calls)}-1.0-py3-none-any.whl").write_text("wheel")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(wheels, "find_pip", lambda: ["pip"])
    monkeypatch.setattr(wheels.subprocess, "run", fake_run)
    root = tmp_path / "cache" / "wheelhouse"
    houses = {
        docker_images.fetch_wheels(["pytest==8.3.5"]),
        asyncio.run(ImageBuilder().wheelhouse(EnvironmentSpec(packages=["pytest==7.4.4"]))),
    }
    openenv_build.collect_wheels(["openenv-core[core]"], tmp_path / "ctx")
    assert all(h.parent == root for h in houses) and len(houses) == 2
    assert len(list(root.iterdir())) == 3 and len(calls) == 3
    assert list((tmp_path / "ctx" / "wheels").glob("*.whl"))
    docker_images.fetch_wheels(["pytest==8.3.5"])  # cached: no pip run
    assert len(calls) == 3
    assert all("--only-binary=:all:" in argv for argv in calls)
