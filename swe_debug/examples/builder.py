"""Build the example dataset: fetch sdists with `pip download`, diff releases into
gold and test patches, compute the reproducible base commit, write
`examples.jsonl` (source archives referenced relative to it) and optionally
build every image.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sandboxes.settings import current as current_settings

from ..images import ROOT, ImageBuilder, find_pip, materialize_source
from ..instances import EnvironmentSpec, SourceSpec, SWEInstance

HERE = Path(__file__).resolve().parent
REPO_OUT = ROOT / ".cache" / "swe-examples"


def default_out() -> Path:
    """Where the example taskset goes: the running settings' $VF_SWE_EXAMPLES
    (`sandboxes.settings.current()`), else .cache/swe-examples."""
    configured = current_settings().swe_examples
    return Path(configured) if configured else REPO_OUT

METADATA = HERE / "metadata.json"
HANG_SCRIPT = HERE / "hang.sh"

PYTEST_ENV = EnvironmentSpec(packages=["pytest==7.4.4"])
DATEUTIL_ENV = EnvironmentSpec(
    packages=["pytest==7.4.4", "pytest-cov==4.1.0", "coverage==7.4.0", "six==1.16.0"],
    # freezegun depends on python-dateutil: installing its deps would shadow the code under test
    no_deps_packages=["freezegun==1.4.0"],
)
UNITTEST_CMD = "python -m unittest -v"


@dataclass
class Example:
    """One upstream fix between two releases."""

    instance_id: str
    repo: str
    dist: str  # PyPI name
    base: str
    fix: str
    gold_paths: list[str]
    test_paths: list[str]
    environment: EnvironmentSpec
    exclude: list[str] = field(default_factory=list)
    test_cmd: str | None = None
    test_directives: list[str] | None = None
    log_parser: str = "pytest"
    note: str = ""


EXAMPLES: list[Example] = [
    Example(
        instance_id="kjd__idna-3.4",
        repo="kjd/idna",
        dist="idna", base="3.3", fix="3.4",
        gold_paths=["idna/core.py"],  # the encode() fix; the Unicode 15 data refresh is left out
        test_paths=["tests/test_idna.py"],
        environment=PYTEST_ENV,
        note="encode() of non-ASCII bytes raised UnicodeDecodeError instead of IDNAError",
    ),
    Example(
        instance_id="dateutil__dateutil-2.8.2",
        repo="dateutil/dateutil",
        dist="python-dateutil", base="2.8.1", fix="2.8.2",
        gold_paths=["dateutil/"],
        # the zoneinfo tarball is binary data, _version.py a build artefact; the
        # property-based tests need hypothesis and are not part of the test patch
        exclude=["dateutil/zoneinfo/", "dateutil/_version.py", "dateutil/test/property/"],
        test_paths=["dateutil/test/"],
        environment=DATEUTIL_ENV,
        note="four bug fixes (isoparser, parser, rrule, tz); the suite needs pytest-cov to collect",
    ),
    Example(
        instance_id="more-itertools__more-itertools-10.2.0",
        repo="more-itertools/more-itertools",
        dist="more-itertools", base="10.1.0", fix="10.2.0",
        gold_paths=["more_itertools/"],
        test_paths=["tests/"],
        environment=PYTEST_ENV,
        test_cmd=UNITTEST_CMD,
        test_directives=["tests.test_more", "tests.test_recipes"],
        log_parser="unittest",
        note="new functions and fixes; run with unittest like upstream's tox",
    ),
]


# ---------------------------------------------------------------------------- fetching and diffing


def fetch_sdist(dist: str, version: str, dest: Path) -> Path:
    """The sdist of dist==version, downloaded once with pip."""
    dest.mkdir(parents=True, exist_ok=True)
    stem = f"{dist}-{version}"
    for cand in dest.glob("*.tar.gz"):
        if cand.name.lower().replace("_", "-") == f"{stem}.tar.gz".lower().replace("_", "-"):
            return cand
    r = subprocess.run(
        [*find_pip(), "download", "-q", "--disable-pip-version-check", "--no-deps", "--no-binary", ":all:",
         "-d", str(dest), f"{dist}=={version}"],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"pip download {dist}=={version} failed:\n{r.stdout}{r.stderr}")
    return fetch_sdist(dist, version, dest)


def _selected(rel: str, include: list[str], exclude: list[str]) -> bool:
    def hit(prefixes: list[str]) -> bool:
        return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes)

    return hit(include) and not hit(exclude)


def _copy_selected(tree: Path, dest: Path, include: list[str], exclude: list[str]) -> None:
    for p in sorted(tree.rglob("*")):
        if p.is_dir() or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(tree).as_posix()
        if _selected(rel, include, exclude):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest / rel)


def release_diff(old: Path, new: Path, include: list[str], exclude: list[str]) -> str:
    """Unified diff (git format, a/ b/ prefixes) of the selected paths between two trees."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "a").mkdir()
        (t / "b").mkdir()
        _copy_selected(old, t / "a", include, exclude)
        _copy_selected(new, t / "b", include, exclude)
        r = subprocess.run(
            ["git", "diff", "--no-index", "--no-renames", "--binary", "--src-prefix=", "--dst-prefix=", "a", "b"],
            cwd=t, capture_output=True, text=True,
            env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"},
        )
        if r.returncode not in (0, 1):
            raise RuntimeError(f"git diff failed: {r.stderr}")
        return r.stdout


def snapshot_commit(tree: Path) -> str:
    """The hash `images/swe/setup-repo.sh` gives this tree (same script, run on the host)."""
    script = (ROOT / "images" / "swe" / "setup-repo.sh").read_text()
    script = script.replace("@BASE_COMMIT@", "").replace("@VERIFY@", "0").replace("@INSTALL@", "true")
    script = script.replace("cd /testbed", "").replace("/testbed", str(tree))
    with tempfile.TemporaryDirectory() as home:
        env = {"HOME": home, "PATH": os.environ.get("PATH", ""), "GIT_CONFIG_NOSYSTEM": "1"}
        subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tree, env=env, check=True, capture_output=True)
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


# ---------------------------------------------------------------------------- dataset


def _split_id(test_id: str) -> tuple[str, str]:
    """`file.py::Class::test[p]` → (`file.py::Class`, `test[p]`); `mod.Class.test` → (`mod.Class`, `test`)."""
    head = test_id.split("[", 1)[0]
    sep = "::" if "::" in head else "."
    i = head.rfind(sep)
    return test_id[:i], test_id[i + len(sep):]


def group_ids(ids: list[str]) -> dict[str, list[str]]:
    """Test ids grouped by their parent (file/class), to keep metadata.json small."""
    out: dict[str, list[str]] = {}
    for t in sorted(ids):
        parent, leaf = _split_id(t)
        out.setdefault(parent, []).append(leaf)
    return out


def expand_ids(grouped: dict[str, list[str]]) -> list[str]:
    out = []
    for parent, leaves in grouped.items():
        sep = "::" if ("::" in parent or parent.endswith(".py")) else "."
        out += [f"{parent}{sep}{leaf}" for leaf in leaves]
    return out


def _metadata() -> dict:
    """{instance_id: {"FAIL_TO_PASS": [...], "PASS_TO_PASS": [...]}} from metadata.json."""
    if not METADATA.exists():
        return {}
    raw = json.loads(METADATA.read_text())
    return {iid: {k: expand_ids(v) for k, v in lists.items()} for iid, lists in raw.items()}


def build_dataset(out: Path | None = None, with_metadata: bool = True) -> Path:
    """Write out/examples.jsonl (and out/sdists/; default `default_out()`). Returns the dataset path."""
    out = out or default_out()
    out.mkdir(parents=True, exist_ok=True)
    sdists = out / "sdists"
    meta = _metadata() if with_metadata else {}
    rows: list[SWEInstance] = []
    for ex in EXAMPLES:
        old_sd, new_sd = fetch_sdist(ex.dist, ex.base, sdists), fetch_sdist(ex.dist, ex.fix, sdists)
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            for sd, name in ((old_sd, "old"), (new_sd, "new")):
                with tarfile.open(sd) as tf:
                    tf.extractall(t / name, filter="data")
            old = next((t / "old").iterdir())
            new = next((t / "new").iterdir())
            gold = release_diff(old, new, ex.gold_paths, ex.exclude + ex.test_paths)
            tests = release_diff(old, new, ex.test_paths, ex.exclude)
            src = SourceSpec(archive=os.path.relpath(old_sd, out), strip_components=1)
            probe = SWEInstance(instance_id=ex.instance_id, source=SourceSpec(archive=str(old_sd)))
            materialize_source(probe, t / "snap")
            base_commit = snapshot_commit(t / "snap")
        m = meta.get(ex.instance_id, {})
        kw = dict(test_cmd=ex.test_cmd) if ex.test_cmd else {}
        inst = SWEInstance(
            instance_id=ex.instance_id, repo=ex.repo, base_commit=base_commit, version=ex.fix,
            patch=gold, test_patch=tests,
            FAIL_TO_PASS=m.get("FAIL_TO_PASS", []), PASS_TO_PASS=m.get("PASS_TO_PASS", []),
            environment=ex.environment, source=src, test_directives=ex.test_directives,
            log_parser=ex.log_parser, problem_statement=ex.note, **kw,
        )
        rows.append(inst)
    rows += _variants(rows[0], meta)
    path = out / "examples.jsonl"
    tmp_path = path.with_suffix(".tmp")
    with tmp_path.open("w") as fh:
        for r in rows:
            fh.write(r.model_dump_json(exclude_none=True) + "\n")
    os.replace(tmp_path, path)
    return path


def _variants(idna: SWEInstance, meta: dict) -> list[SWEInstance]:
    """Instances that must NOT come out valid."""
    # 1. The test patch got lost: the listed FAIL_TO_PASS test is the old one, which
    #    already passes on the base. Gold run passes; --check-fails-before must flag it.
    passes_before = idna.model_copy(deep=True)
    passes_before.instance_id = "kjd__idna-3.4-passes-before"
    passes_before.test_patch = ""
    passes_before.test_directives = ["tests/test_idna.py"]
    passes_before.problem_statement = "invalid on purpose: FAIL_TO_PASS already passes without the gold patch"
    passes_before.FAIL_TO_PASS = meta.get(passes_before.instance_id, {}).get("FAIL_TO_PASS", [])
    passes_before.PASS_TO_PASS = meta.get(passes_before.instance_id, {}).get("PASS_TO_PASS", [])
    # 2. The gold patch was made against other code: the line it removes does not exist,
    #    so git apply, git apply --reject and patch --forward --fuzz=5 all refuse it.
    bad_gold = idna.model_copy(deep=True)
    bad_gold.instance_id = "kjd__idna-3.4-bad-gold"
    bad_gold.patch = idna.patch.replace("-        s = s.decode('ascii')", "-        s = s.decode('latin-1')")
    assert bad_gold.patch != idna.patch, "the idna gold patch changed upstream?"
    bad_gold.problem_statement = "broken on purpose: the gold patch does not apply"
    return [passes_before, bad_gold]


async def build_images(dataset: Path, concurrency: int = 2) -> list[tuple[str, str, list[str], float]]:
    """Build (or find cached) every instance image of the dataset."""
    from ..instances import load_instances

    report = load_instances(dataset)
    if report.errors:
        raise RuntimeError("; ".join(map(str, report.errors)))
    builder = ImageBuilder()
    sem = asyncio.Semaphore(concurrency)

    async def one(inst: SWEInstance):
        async with sem:
            ref = await builder.ensure(inst)
            return inst.instance_id, ref.tag, ref.built, ref.seconds

    return await asyncio.gather(*(one(i) for i in report.instances))
