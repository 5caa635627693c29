"""Published SWE dataset shapes and how each one's columns map onto `SWEInstance`.

The mapping is data (`SHAPES`): the README's table is rendered from it
(`mapping_table`) and `normalize_row` applies it, so the two cannot drift.
A row is recognised by the columns only its dataset publishes (or the shape
is named with `--dataset-format`); a row missing a column its shape needs is a
`ShapeError` naming that column, raised at load time — never a crash later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

ShapeName = Literal["native", "swe-bench", "swe-bench-v5", "swe-gym", "swe-smith", "r2e-gym", "swe-rebench"]
SHAPE_NAMES: tuple[str, ...] = ShapeName.__args__  # type: ignore[attr-defined]

CONDA_PATH = ["/opt/miniconda3/envs/testbed/bin", "/opt/miniconda3/bin", "/opt/conda/envs/testbed/bin"]
"""First on the published images' PATH for the tests: the harness's conda env `testbed`
(the SWE-bench harness `conda activate testbed`s; SWE-smith and SWE-rebench images follow
it). Absent directories are harmless."""

R2E_PATH = ["/testbed/.venv/bin", "/root/.local/bin"]

SWE_BENCH_COLUMNS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "version")


class PublishedShape(BaseModel):
    """One published dataset layout: how it is recognised and where each column goes."""

    name: ShapeName
    datasets: str = Field(description="Hub datasets published in this shape.")
    recognised_by: str = Field(description="The columns that identify the shape when it is not named.")
    required: tuple[str, ...] = Field(description="Columns a row must have (else a load-time error naming the column).")
    columns: dict[str, str] = Field(description="Published column -> what it becomes here.")
    image: str = Field(description="Where the instance image comes from.")
    notes: str = ""


SHAPES: dict[str, PublishedShape] = {s.name: s for s in [
    PublishedShape(
        name="swe-bench",
        datasets="princeton-nlp/SWE-bench, SWE-bench/SWE-bench, SWE-bench/SWE-bench_Verified, SWE-bench/SWE-bench_Lite",
        recognised_by="`environment_setup_commit`",
        required=SWE_BENCH_COLUMNS,
        columns={"instance_id, repo, base_commit, patch, test_patch, version": "same name",
                 "FAIL_TO_PASS, PASS_TO_PASS": "JSON-encoded strings decoded to lists",
                 "problem_statement, hints_text, created_at, environment_setup_commit": "kept, unused"},
        image="`--namespace NS`: `NS/sweb.eval.<arch>.<id>` (`__` → `_1776_`); the tests run in their conda env `testbed`",
        notes="test command, test directives (Django: dotted modules) and log parser from the `swebench` package's "
              "per-repo specs (`MAP_REPO_VERSION_TO_SPECS`, `MAP_REPO_TO_PARSER`) when the row names none",
    ),
    PublishedShape(
        name="swe-bench-v5",
        datasets="SWE-bench datasets published for swebench 5.x (a row's own `eval_script`), SumanthRH/SWE-Gym",
        recognised_by="`eval_script`",
        required=("instance_id", "eval_script", "FAIL_TO_PASS", "PASS_TO_PASS"),
        columns={"instance_id, repo, patch, test_patch, version": "same name",
                 "eval_script": "run as the test step (it resets and applies the test patch itself); the test "
                                "command's exit code recorded after its end marker, the log parsed between its markers",
                 "log_parser": "the `swebench` parser of that name (else pytest)",
                 "image": "image_name", "FAIL_TO_PASS, PASS_TO_PASS": "JSON strings or lists"},
        image="`image` / `image_name`, else `--namespace`",
    ),
    PublishedShape(
        name="swe-gym",
        datasets="SWE-Gym/SWE-Gym, SWE-Gym/SWE-Gym-Lite",
        recognised_by="named only (`--dataset-format swe-gym`): its columns are SWE-bench's without `environment_setup_commit`",
        required=SWE_BENCH_COLUMNS,
        columns={"instance_id, repo, base_commit, patch, test_patch, version": "same name",
                 "FAIL_TO_PASS, PASS_TO_PASS": "lists (sequence of strings)"},
        image="`--namespace xingyaoww` (SWE-Gym's images: `xingyaoww/sweb.eval.x86_64.<id>`, `__` → `_s_`), or `image_name`",
        notes="test command and parser from the `swebench` specs when its repo/version is there (SWE-Gym's repos "
              "mostly are not: give `test_cmd`/`log_parser` columns, else pytest)",
    ),
    PublishedShape(
        name="swe-smith",
        datasets="SWE-bench/SWE-smith, SWE-bench/SWE-smith-py, -go, -java, -js, -ts, -rs, -cpp, -php",
        recognised_by="`image_name` containing `swesmith` and no `test_patch`",
        required=("instance_id", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "image_name"),
        columns={"instance_id, repo, image_name": "same name",
                 "patch": "the BUG: applied by the setup step (`setup_patch`); the gold patch is its reverse",
                 "FAIL_TO_PASS, PASS_TO_PASS": "lists"},
        image="`image_name` (one image per repo@commit, shared by its instances)",
        notes="no test patch: the tests are in the image; the whole suite runs (pytest)",
    ),
    PublishedShape(
        name="r2e-gym",
        datasets="R2E-Gym/R2E-Gym-Lite, R2E-Gym/R2E-Gym-Subset, R2E-Gym/R2E-Gym-V1",
        recognised_by="`parsed_commit_content` or `expected_output_json`",
        required=("commit_hash", "docker_image", "parsed_commit_content", "expected_output_json"),
        columns={"commit_hash": "instance_id (`<repo_name>-<commit_hash>` when repo_name is given)",
                 "repo_name": "repo", "docker_image": "image_name",
                 "parsed_commit_content": "gold patch: the commit's non-test `.py` file diffs",
                 "expected_output_json": "FAIL_TO_PASS = the tests expected PASSED"},
        image="`docker_image`",
        notes="tests hidden in the image under `/r2e_tests` are moved into `/testbed` by the setup step; "
              "`bash run_tests.sh` runs them; ids in R2E's form (`Class.test`, file dropped)",
    ),
    PublishedShape(
        name="swe-rebench",
        datasets="nebius/SWE-rebench, nebius/SWE-rebench-leaderboard, nebius/SWE-rebench-V2",
        recognised_by="`install_config`",
        required=SWE_BENCH_COLUMNS[:-1] + ("install_config",),
        columns={"instance_id, repo, base_commit, patch, test_patch": "same name",
                 "FAIL_TO_PASS, PASS_TO_PASS": "lists or JSON strings",
                 "install_config.test_cmd": "test_cmd (a list runs every command, exit status the highest; no directives appended)",
                 "install_config.log_parser": "log_parser (the `swebench` parser of that name)",
                 "image_name / docker_image": "image_name"},
        image="`image_name` / `docker_image`, else `--namespace`",
        notes="install steps are not re-run (the images are prebuilt); V2 rows (with `language`) work in `/<repo name>`",
    ),
    PublishedShape(
        name="native",
        datasets="rows written for vf-swe-debug (e.g. the example taskset)",
        recognised_by="anything else with `instance_id`",
        required=("instance_id",),
        columns={"every SWEInstance field": "same name (`docker_image` / `image` accepted for `image_name`)"},
        image="`image_name`, `--namespace`, or built from `source` + `environment`",
    ),
]}


class ShapeError(ValueError):
    """A row that does not fit its (detected or named) shape: which column, and why."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def detect_shape(row: Mapping[str, Any]) -> ShapeName:
    """The published shape of `row` by the columns only that dataset publishes."""
    if "parsed_commit_content" in row or "expected_output_json" in row:
        return "r2e-gym"
    if "install_config" in row:
        return "swe-rebench"
    if "eval_script" in row:
        return "swe-bench-v5"
    image = row.get("image_name")
    if isinstance(image, str) and "swesmith" in image.lower() and "test_patch" not in row:
        return "swe-smith"
    if "environment_setup_commit" in row:
        return "swe-bench"
    if "instance_id" in row:
        return "native"
    known = "; ".join(f"{s.name}: {', '.join(s.required)}" for s in SHAPES.values() if s.name != "native")
    cols = ", ".join(sorted(map(str, row))) or "none"
    raise ShapeError("instance_id", f"missing, and the row matches none of the published shapes ({known}); "
                                    f"its columns: {cols}")


_NAMES = ("instance_id", "image_name", "commit_hash", "docker_image")


def _present(row: Mapping[str, Any], key: str) -> bool:
    """A column is missing when absent or null; an empty name counts as missing too (an
    empty patch does not: the gold_patch step refuses it with its own message)."""
    v = row.get(key)
    return v is not None and not (key in _NAMES and isinstance(v, str) and not v.strip())


def normalize_row(row: Mapping[str, Any], shape: str | None = None) -> dict[str, Any]:
    """`row` as `SWEInstance` fields. `shape`: a name from SHAPES, or None to detect it."""
    name = shape or detect_shape(row)
    if name not in SHAPES:
        raise ShapeError("<format>", f"unknown dataset format {name!r}; known: {', '.join(SHAPES)}")
    spec = SHAPES[name]
    missing = [c for c in spec.required if not _present(row, c)]
    if missing:
        raise ShapeError(missing[0], f"missing: a {name} row needs {', '.join(spec.required)} "
                                     f"(missing {', '.join(missing)})")
    out = dict(row)
    if name in ("swe-bench", "swe-gym"):
        from .harness_lib import apply_repo_spec

        out = apply_repo_spec(out)  # a spec's test command activates the env itself
        out.setdefault("test_path", CONDA_PATH)
    elif name == "swe-smith":
        bug = str(row["patch"])
        out.update(setup_patch=bug, patch=reverse_patch(bug))
        out.setdefault("test_path", CONDA_PATH)
    elif name == "r2e-gym":
        out.update(_r2e(row))
    elif name == "swe-rebench":
        out.update(_rebench(row))
    out["dataset_format"] = name
    if name != "native":
        out.setdefault("keep_untracked", True)  # images made elsewhere: their untracked files are their state
    if name == "swe-gym":
        out.setdefault("image_scheme", "swe-gym")
    return out


# ---------------------------------------------------------------------------- SWE-rebench


def _rebench(row: Mapping[str, Any]) -> dict[str, Any]:
    cfg = row["install_config"]
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg)
        except json.JSONDecodeError as exc:
            raise ShapeError("install_config", f"not JSON: {exc.msg}") from None
    if not isinstance(cfg, Mapping):
        raise ShapeError("install_config", f"must be an object, got {type(cfg).__name__}")
    cmd = cfg.get("test_cmd")
    if hasattr(cmd, "tolist"):
        cmd = cmd.tolist()
    if isinstance(cmd, (list, tuple)):
        cmds = [c for c in cmd if isinstance(c, str) and c.strip()]
        # every command runs; the status is the highest of theirs (a 2 is not masked by a later 1)
        cmd = cmds[0] if len(cmds) == 1 else ("rc=0; " + " ".join(f"{{ {c}\n}}; s=$?; [ $s -gt $rc ] && rc=$s;" for c in cmds)
                                              + " exit $rc") if cmds else None
    if not isinstance(cmd, str) or not cmd.strip():
        raise ShapeError("install_config.test_cmd", "missing or empty (the command that runs the tests)")
    out: dict[str, Any] = {"test_cmd": cmd, "test_directives": [], "test_path": CONDA_PATH}
    if cfg.get("log_parser"):
        out["log_parser"] = str(cfg["log_parser"])
    if row.get("language") and "/" in str(row.get("repo", "")):
        out["workdir"] = "/" + str(row["repo"]).split("/", 1)[1]
    return out


# ---------------------------------------------------------------------------- R2E-Gym


def _is_test_path(path: str) -> bool:
    parts = path.split("/")
    return (path.endswith("_test.py") or parts[-1].startswith("test_")
            or any(p in ("tests", "Tests", "test", "Test") for p in parts))


def r2e_gold_patch(parsed_commit_content: Any) -> str:
    """The gold patch of an R2E-Gym row: its commit's diffs of non-test `.py` files,
    rebuilt as a unified diff from `parsed_commit_content` (R2E's ParsedCommit JSON)."""
    data = json.loads(parsed_commit_content) if isinstance(parsed_commit_content, str) else parsed_commit_content
    if not isinstance(data, Mapping) or not isinstance(data.get("file_diffs"), list):
        raise ShapeError("parsed_commit_content", "not R2E's ParsedCommit JSON (no `file_diffs` list)")
    lines: list[str] = []
    for fd in data["file_diffs"]:
        header = fd.get("header") or {}
        path = (header.get("file") or {}).get("path", "")
        if not path or not path.endswith(".py") or _is_test_path(path):
            continue
        lines.append(f"diff --git a/{path} b/{path}")
        if header.get("misc_line"):
            lines.append(header["misc_line"])
        idx = fd.get("index_line")
        if idx:
            mode = idx.get("mode") or ""
            lines.append(f"index {idx.get('old_commit_hash', '')}..{idx.get('new_commit_hash', '')}" + (f" {mode}" if mode else ""))
        minus, plus = fd.get("minus_file"), fd.get("plus_file")
        if minus and plus:
            lines += [f"--- {minus['path']}", f"+++ {plus['path']}"]
        for hunk in fd.get("hunks") or []:
            d = hunk.get("descriptor") or {}
            old, new = d.get("old_range") or {}, d.get("new_range") or {}

            def rng(r: Mapping[str, Any]) -> str:
                return f"{r.get('start', 0)}" + (f",{r['length']}" if r.get("length") is not None else "")

            lines.append(f"@@ -{rng(old)} +{rng(new)} @@" + (f" {d['section']}" if d.get("section") else ""))
            for ln in (hunk.get("line_group") or {}).get("all_lines") or []:
                prefix = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}.get(ln.get("type", ""))
                if prefix is not None:
                    lines.append(prefix + ln.get("content", ""))
    return "\n".join(lines) + "\n" if lines else ""


def _r2e(row: Mapping[str, Any]) -> dict[str, Any]:
    expected = row["expected_output_json"]
    try:
        expected = json.loads(expected) if isinstance(expected, str) else dict(expected)
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ShapeError("expected_output_json", f"not a JSON object: {exc}") from None
    passing = sorted(_r2e_key(k) for k, v in expected.items() if str(v).upper() == "PASSED")
    repo = str(row.get("repo_name") or row.get("repo") or "")
    commit = str(row["commit_hash"])
    gold = r2e_gold_patch(row["parsed_commit_content"])
    return {
        "instance_id": row.get("instance_id") or (f"{repo}-{commit}" if repo else commit),
        "repo": repo, "image_name": row["docker_image"], "patch": gold, "test_patch": "",
        "FAIL_TO_PASS": passing, "PASS_TO_PASS": [],
        # moved in and ignored (so resetting the tree between apply rungs keeps them)
        "setup_commands": ["if [ -d /r2e_tests ]; then rm -rf r2e_tests && mv /r2e_tests ./r2e_tests"
                           " && echo /r2e_tests >> .git/info/exclude; fi"],
        "test_cmd": "bash run_tests.sh", "test_directives": [], "log_parser": "r2e-pytest", "test_path": R2E_PATH,
    }


_ANSI_KEY = re.compile(r"\x1b\[\d+m")


def _r2e_key(k: str) -> str:
    return _ANSI_KEY.sub("", str(k)).split(" - ")[0]


# ---------------------------------------------------------------------------- reversing a diff

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


def _swap_header(ln: str, nxt: str | None) -> tuple[list[str], int]:
    """A file-header line of a git diff, reversed: (lines, how many input lines used)."""
    if ln.startswith("diff --git "):
        m = re.match(r"^diff --git a/(.+?) b/(.+)$", ln)
        return [f"diff --git a/{m.group(2)} b/{m.group(1)}" if m else ln], 1
    if ln.startswith("--- ") and nxt is not None and nxt.startswith("+++ "):
        def side(p: str, prefix: str) -> str:
            return p if p == "/dev/null" or p[:2] not in ("a/", "b/") else prefix + p[2:]
        return [f"--- {side(nxt[4:], 'a/')}", f"+++ {side(ln[4:], 'b/')}"], 2
    for a, b in (("new file mode ", "deleted file mode "), ("deleted file mode ", "new file mode ")):
        if ln.startswith(a):
            return [b + ln[len(a):]], 1
    for a, b in (("old mode ", "new mode "), ("rename from ", "rename to "), ("copy from ", "copy to ")):
        if ln.startswith(a) and nxt is not None and nxt.startswith(b):
            return [a + nxt[len(b):], b + ln[len(a):]], 2
    m = re.match(r"^index ([0-9a-fA-F]+)\.\.([0-9a-fA-F]+)(.*)$", ln)
    if m:
        return [f"index {m.group(2)}..{m.group(1)}{m.group(3)}"], 1
    return [ln], 1


def reverse_patch(patch: str) -> str:
    """The unified (git) diff that undoes `patch`: old and new sides swapped (file
    headers, modes, renames, hunk ranges, +/- lines, removals before additions in each
    run of changes). SWE-smith publishes the bug, so its gold patch is this."""
    lines = patch.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if not m:
            nxt = lines[i + 1] if i + 1 < len(lines) else None
            got, used = _swap_header(lines[i], nxt)
            out += got
            i += used
            continue
        o_start, o_len, n_start, n_len, tail = m.groups()
        old_left = int(o_len) if o_len is not None else 1
        new_left = int(n_len) if n_len is not None else 1
        out.append(f"@@ -{n_start}{'' if n_len is None else ',' + n_len} +{o_start}{'' if o_len is None else ',' + o_len} @@{tail}")
        i += 1
        minus: list[str] = []
        plus: list[str] = []

        def flush() -> None:
            out.extend(minus + plus)
            minus.clear()
            plus.clear()

        last = out  # where the previous body line went: a "\\ No newline" marker follows it
        while i < len(lines) and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
            ln = lines[i]
            if ln.startswith("\\"):
                last.append(ln)
            elif ln.startswith("+"):
                minus.append("-" + ln[1:])
                new_left, last = new_left - 1, minus
            elif ln.startswith("-"):
                plus.append("+" + ln[1:])
                old_left, last = old_left - 1, plus
            else:
                flush()
                out.append(ln)
                old_left, new_left, last = old_left - 1, new_left - 1, out
            i += 1
        flush()
    return "\n".join(out)


# ---------------------------------------------------------------------------- the README table


def mapping_table() -> str:
    """The README's table of published shapes (rendered from SHAPES)."""
    rows = ["| format | datasets | recognised by | columns → here | image | notes |", "|---|---|---|---|---|---|"]
    for s in SHAPES.values():
        cols = "; ".join(f"`{k}` → {v}" for k, v in s.columns.items())
        rows.append(f"| `{s.name}` | {s.datasets} | {s.recognised_by} | {cols} | {s.image} | {s.notes} |")
    return "\n".join(rows)
