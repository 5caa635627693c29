"""SWE task instances: the SWE-bench row schema plus what an offline run needs
to build its environment, and the loaders (JSON, JSONL, parquet, a `datasets`
dataset). A malformed row is reported with its index and field and never
stops the other rows from loading.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

DEFAULT_TEST_CMD = "python -m pytest -rA -v --color=no -p no:cacheprovider"
"""pytest with every result line (-rA), one verbose line per test, colour off
(overrides a project's `addopts = --color=yes`) and no cache writes."""

DEFAULT_EVAL_ENV = {
    "PYTHONHASHSEED": "0",
    "TZ": "UTC",
    "LC_ALL": "C.UTF-8",
    "PY_COLORS": "0",
    "NO_COLOR": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PIP_NO_INDEX": "1",
}
"""Pinned so that a run does not depend on the host (SWE-bench #602: no hash-seed/TZ pinning)."""

NON_TEST_EXTS = (".json", ".txt", ".md", ".rst", ".csv", ".yml", ".yaml", ".toml", ".cfg", ".ini", ".in")


class EnvironmentSpec(BaseModel):
    """The environment layer: a venv at /opt/venv filled from a host-side wheelhouse."""

    model_config = ConfigDict(extra="forbid")

    python_version: str = Field("3.11", description="Python of the base image; wheels are downloaded for it.")
    packages: list[str] = Field(default_factory=list, description="Pinned requirements, installed with their deps.")
    no_deps_packages: list[str] = Field(
        default_factory=list,
        description="Installed without dependencies (e.g. a plugin that would pull in a newer copy of the package under test).",
    )
    setup: list[str] = Field(default_factory=list, description="Extra shell commands run (offline) at the end of the layer.")


class SourceSpec(BaseModel):
    """Where the repository at `base_commit` comes from when no prebuilt image is used."""

    model_config = ConfigDict(extra="forbid")

    archive: str | None = Field(None, description="A .tar/.tar.gz of the tree (relative paths are relative to the dataset file).")
    dir: str | None = Field(None, description="A directory holding the tree (copied as is, .git excluded).")
    strip_components: int = Field(1, ge=0, description="Leading path components dropped from archive members.")
    verify_commit: bool = Field(
        True,
        description="The snapshot is committed with a fixed identity and date; require its hash to equal base_commit.",
    )

    @model_validator(mode="after")
    def _one_source(self):
        if bool(self.archive) == bool(self.dir):
            raise ValueError("exactly one of source.archive / source.dir is required")
        return self


class SWEInstance(BaseModel):
    """One SWE-style task: a repo at a base commit, a gold patch, a test patch and the test lists.

    Unknown columns (problem_statement, hints_text, ... or a dataset's own) are kept.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str = Field(min_length=1)
    repo: str = ""
    base_commit: str = ""
    patch: str = Field("", description="The gold patch (unified diff).")
    test_patch: str = Field("", description="The diff adding/changing the tests.")
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str | None = None

    # what an offline run needs
    image_name: str | None = Field(None, description="A prebuilt instance image; used when it exists locally.")
    image_scheme: Literal["swe-bench", "swe-gym"] = Field(
        "swe-bench", description="How --namespace names the row's image when it names none (images.IMAGE_SCHEMES).")
    keep_untracked: bool = Field(
        False, description="The image ships untracked files in its work tree (a published image): setup keeps them "
                           "(git-excluded) instead of refusing an unclean tree.")
    environment: EnvironmentSpec | None = None
    source: SourceSpec | None = None
    install: list[str] = Field(default_factory=list, description="Commands run in /testbed when the instance layer is built.")
    setup_commands: list[str] = Field(default_factory=list, description="Commands run in the sandbox by the setup step.")
    setup_patch: str = Field("", description="A diff the setup step applies before the debug step (SWE-smith: the bug).")
    dataset_format: str = Field("native", description="The published shape the row was read as (swe_debug.published).")
    test_cmd: str = DEFAULT_TEST_CMD
    eval_script: str = Field("", description="The row's own test script (swebench 5.x datasets): it resets and applies "
                             "the test patch and runs the tests between the harness's markers; replaces test_cmd.")
    test_path: list[str] = Field(default_factory=list, description="Directories put first on PATH for the test command "
                                 "(the published images' conda env).")
    test_directives: list[str] | None = Field(None, description="Test paths/modules; default: the files of test_patch.")
    log_parser: Literal["pytest", "unittest"] | str = "pytest"
    eval_env: dict[str, str] = Field(default_factory=dict, description="Extra environment of setup/debug/test commands.")
    workdir: str = "/testbed"

    @field_validator("log_parser")
    @classmethod
    def _known_parser(cls, v: str) -> str:
        """An unknown parser is the row's error at load time (not an infrastructure error
        every resume would retry after running the tests)."""
        from .harness_lib import SwebenchMissing
        from .parser_names import has_parser
        from .parsers import known_parsers

        try:
            found = has_parser(v)
        except SwebenchMissing as exc:
            raise ValueError(str(exc)) from None
        if not found:
            raise ValueError(f"unknown log parser {v!r}; known: {', '.join(sorted(known_parsers()))}, the swebench "
                             "package's (swebench:<owner/repo>, parse_log_<name>), or register one with "
                             "swe_debug.parsers.register_parser")
        return v

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        """The hub stores the test lists as JSON-encoded strings; accept both forms."""
        if v is None:
            return []
        if isinstance(v, str):
            s = v.strip()
            if not s:
                return []
            try:
                v = json.loads(s)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list: {exc.msg}") from None
        if hasattr(v, "tolist"):  # numpy arrays from parquet
            v = v.tolist()
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise ValueError("must be a list of test ids (strings)")
        return list(v)

    @field_validator("environment", "source", mode="before")
    @classmethod
    def _json_obj(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip():
            return json.loads(v)
        return v or None

    @field_validator("install", "setup_commands", mode="before")
    @classmethod
    def _json_cmds(cls, v: Any) -> Any:
        if v is None:
            return []
        if isinstance(v, str):
            s = v.strip()
            return json.loads(s) if s.startswith("[") else ([s] if s else [])
        if hasattr(v, "tolist"):
            v = v.tolist()
        return v

    @model_validator(mode="after")
    def _runnable(self, info: ValidationInfo):
        if not self.image_name and not self.source and not (info.context or {}).get("named_images"):
            raise ValueError("needs `image_name` (a prebuilt image) or `source` (to build one), "
                             "or --namespace / --registry to run the SWE-bench image of that name")
        return self

    @model_validator(mode="before")
    @classmethod
    def _image_aliases(cls, row: Any) -> Any:
        """Published datasets name the instance image `image_name`, `docker_image` or `image`."""
        if isinstance(row, Mapping) and not row.get("image_name"):
            for alias in ("docker_image", "image"):
                if isinstance(row.get(alias), str) and row[alias]:
                    return {**row, "image_name": row[alias]}
        return row

    def directives(self) -> list[str]:
        """What the test command is given: `test_directives`, else the test files the test patch touches."""
        if self.test_directives is not None:
            return list(self.test_directives)
        return [p for p in patch_files(self.test_patch) if not p.endswith(NON_TEST_EXTS)]

    def run_env(self) -> dict[str, str]:
        return {**DEFAULT_EVAL_ENV, **self.eval_env}


class RowError(BaseModel):
    """A row that could not be loaded: where and why."""

    index: int
    instance_id: str | None = None
    field: str
    message: str

    def __str__(self) -> str:
        who = f" ({self.instance_id})" if self.instance_id else ""
        return f"row {self.index}{who}: {self.field}: {self.message}"


class LoadReport(BaseModel):
    """What a dataset yielded: the instances that validated and the rows that did not."""

    instances: list[SWEInstance] = Field(default_factory=list)
    errors: list[RowError] = Field(default_factory=list)
    source: str = ""

    def select(self, ids: Iterable[str] | None) -> list[SWEInstance]:
        """The instances named by `ids` (all when None). Unknown ids raise KeyError."""
        if not ids:
            return list(self.instances)
        wanted = list(dict.fromkeys(ids))
        by_id = {i.instance_id: i for i in self.instances}
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise KeyError(f"instance ids not in the dataset: {', '.join(missing)}")
        return [by_id[i] for i in wanted]


_DIFF_FILE = re.compile(r"^diff --git a/(?P<a>.+?) b/(?P<b>.+)$")
_PLUS_FILE = re.compile(r"^\+\+\+ (?:b/)?(?P<p>.+?)(?:\t.*)?$")
_MINUS_FILE = re.compile(r"^--- (?:a/)?(?P<p>.+?)(?:\t.*)?$")


def patch_file_changes(patch: str) -> list[tuple[str, str]]:
    """(path, kind) for every file a unified diff touches; kind is added|deleted|modified."""
    out: dict[str, str] = {}
    old: str | None = None
    for line in patch.splitlines():
        if line.startswith("--- "):
            m = _MINUS_FILE.match(line)
            old = m.group("p") if m else None
        elif line.startswith("+++ ") and old is not None:
            m = _PLUS_FILE.match(line)
            new = m.group("p") if m else None
            if new == "/dev/null" and old != "/dev/null":
                out[old] = "deleted"
            elif old == "/dev/null" and new:
                out[new] = "added"
            elif new:
                out.setdefault(new, "modified")
            old = None
    return list(out.items())


def patch_files(patch: str) -> list[str]:
    return [p for p, _ in patch_file_changes(patch)]


# ---------------------------------------------------------------------------- loading


def dataset_name(dataset: Any) -> str:
    """A short name for results and the run registry: the file stem, dir or hub name."""
    if isinstance(dataset, (str, Path)):
        p = Path(dataset)
        return p.stem if p.suffix else p.name
    return type(dataset).__name__


def _row_id(row: Mapping[str, Any]) -> str | None:
    for key in ("instance_id", "commit_hash"):
        if isinstance(row.get(key), str) and row[key]:
            return row[key]
    return None


def _row_error(index: int, row: Mapping[str, Any], exc: ValidationError) -> RowError:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or "<row>"
    return RowError(index=index, instance_id=_row_id(row), field=field, message=first["msg"])


def validate_rows(rows: Iterable[Any], base_dir: Path | None = None, source: str = "",
                  named_images: bool = False, dataset_format: str | None = None) -> LoadReport:
    """Validate raw rows; relative source paths are resolved against `base_dir`.
    `named_images`: rows may have neither image nor source (a registry namespace names
    their images). `dataset_format`: the published shape of every row (a name of
    `published.SHAPES`); None recognises each row's shape by its columns."""
    from .published import ShapeError, normalize_row

    report = LoadReport(source=source)
    seen: set[str] = set()
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            report.errors.append(RowError(index=index, field="<row>", message=f"not an object: {type(row).__name__}"))
            continue
        try:
            fields = normalize_row(row, dataset_format)
        except ShapeError as exc:
            report.errors.append(RowError(index=index, instance_id=_row_id(row), field=exc.field, message=exc.message))
            continue
        try:
            inst = SWEInstance.model_validate(fields, context={"named_images": named_images})
        except ValidationError as exc:
            report.errors.append(_row_error(index, row, exc))
            continue
        except (ValueError, TypeError) as exc:  # JSON inside a string column
            report.errors.append(RowError(index=index, instance_id=_row_id(row), field="<row>", message=str(exc)))
            continue
        if inst.instance_id in seen:
            report.errors.append(
                RowError(index=index, instance_id=inst.instance_id, field="instance_id", message="duplicate instance_id")
            )
            continue
        seen.add(inst.instance_id)
        if inst.source and base_dir is not None:
            for attr in ("archive", "dir"):
                val = getattr(inst.source, attr)
                if val and not Path(val).is_absolute():
                    setattr(inst.source, attr, str((base_dir / val).resolve()))
        report.instances.append(inst)
    return report


def _read_jsonl(path: Path, report_errors: list[RowError]) -> list[Any]:
    rows: list[Any] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                report_errors.append(RowError(index=len(rows), field="<json>", message=f"line {lineno + 1}: {exc.msg}"))
                rows.append(None)
    return rows


def _load_from_path(dataset: str | Path, split: str, kw: dict[str, Any]) -> LoadReport:
    """`load_instances` of a path or a hub name ("org/name": a string with one slash, no suffix, no such path);
    `kw` are load_instances' validation options."""
    path = Path(dataset)
    if not path.exists():
        if isinstance(dataset, str) and dataset.count("/") == 1 and not path.suffix:
            import datasets  # a hub name such as "org/name" (needs the hub or its local cache)

            return load_instances(datasets.load_dataset(dataset, split=split), split, **kw)
        raise FileNotFoundError(f"dataset not found: {path}")
    base = path.parent.resolve()
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _load_jsonl(path, base, kw)
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, Mapping):
            data = data.get("instances", data.get("data", [data]))
        return validate_rows(data, base, str(path), **kw)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return validate_rows(pq.read_table(path).to_pylist(), base, str(path), **kw)
    if path.is_dir():
        import datasets

        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(path))  # a save_to_disk directory
        else:  # a local copy of a hub dataset repo (data/<split>-*.parquet ...): the hub's code path
            ds = datasets.load_dataset(str(path), split=split)
        return load_instances(ds, split, **kw)
    raise ValueError(f"unsupported dataset file type: {path.name} (want .json, .jsonl, .parquet or a datasets dir)")


def _load_jsonl(path: Path, base: Path, kw: dict[str, Any]) -> LoadReport:
    """Validate a .jsonl file's rows; a line that is not JSON is reported with its parse error."""
    pre: list[RowError] = []
    rows = _read_jsonl(path, pre)
    report = validate_rows(rows, base, str(path), **kw)
    # rows that were not JSON were validated as None: replace that message by the parse error
    bad = {e.index for e in pre}
    report.errors = pre + [e for e in report.errors if e.index not in bad]
    report.errors.sort(key=lambda e: e.index)
    return report


def load_instances(dataset: Any, split: str = "test", named_images: bool = False,
                   dataset_format: str | None = None) -> LoadReport:
    """Load instances from a path (.json, .jsonl, .parquet, a `datasets` save_to_disk
    directory or a local copy of a hub dataset repo), a hub name ("org/name", split `split`) or a `datasets.Dataset` /
    DatasetDict / iterable of dicts. `dataset_format`: see `validate_rows`."""
    from .published import SHAPES

    if dataset_format is not None and dataset_format not in SHAPES:
        raise ValueError(f"unknown dataset format {dataset_format!r}; known: {', '.join(SHAPES)}")
    kw = {"named_images": named_images, "dataset_format": dataset_format}
    if isinstance(dataset, (str, Path)):
        return _load_from_path(dataset, split, kw)
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        datasets = None
    if datasets is not None and isinstance(dataset, datasets.DatasetDict):
        dataset = dataset[split] if split in dataset else next(iter(dataset.values()))
    return validate_rows(iter(dataset), None, type(dataset).__name__, **kw)
