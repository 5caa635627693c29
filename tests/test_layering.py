"""The package layering, enforced in CI: `lint-imports` (import-linter, the
contracts in pyproject.toml's [tool.importlinter]) must pass, and no module
outside `backends/` names a backend module in a string (a dynamic import the
import graph cannot see), except the backend registry that maps names to
import paths.

    swe_debug -> vfcli -> dashboard -> hosted -> runner -> runs -> testmodel -> envs -> sandboxes <- backends
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from source_tree import parse_file

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# "backends.docker.images_cli", "backends.local:LocalBackend", ...
BACKEND_PATH = re.compile(r"^backends(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$")
REGISTRY = Path("sandboxes/registry.py")  # the one place built-in backends are named (by import path)


def test_import_contracts_hold():
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} missing: install the dev extra (import-linter)"
    proc = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, f"lint-imports failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    assert "BROKEN" not in proc.stdout and "Contracts: " in proc.stdout, proc.stdout


def dynamic_backend_imports() -> list[str]:
    found = []
    for package in ("sandboxes", "envs", "runs", "runner", "hosted", "dashboard", "vfcli", "testmodel", "swe_debug"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == REGISTRY:
                continue
            tree = parse_file(path, str(rel))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and BACKEND_PATH.match(node.value):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    return found


def test_no_backend_module_named_outside_backends_and_the_registry():
    found = dynamic_backend_imports()
    assert not found, "modules outside backends/ name a backend module (a hidden import of a concrete backend):\n" + "\n".join(found)


def test_backend_path_pattern():
    assert BACKEND_PATH.match("backends.docker.images_cli") and BACKEND_PATH.match("backends.local:LocalBackend")
    assert not BACKEND_PATH.match("backends/docker is one backend") and not BACKEND_PATH.match("backends")
