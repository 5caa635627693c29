"""SWE instance model and loaders (JSON, JSONL, parquet, `datasets`), patch file
lists, the JUnit writer and the crash-safe results file — no Docker needed."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from swe_debug.instances import SWEInstance, load_instances, patch_file_changes
from runner.junit import write_junit
from runner.writer import ResultsWriter, load_existing, missing_inputs, needs_rerun

TEST_PATCH = """diff --git a/tests/test_a.py b/tests/test_a.py
index 1111111..2222222 100644
--- a/tests/test_a.py
+++ b/tests/test_a.py
@@ -1 +1,2 @@
 x = 1
+y = 2
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1 @@
+def test_new(): pass
diff --git a/tests/data.json b/tests/data.json
deleted file mode 100644
--- a/tests/data.json
+++ /dev/null
@@ -1 +0,0 @@
-{}
"""


def row(i: int, **kw) -> dict:
    base = {
        "instance_id": f"org__repo-{i}",
        "repo": "org/repo",
        "base_commit": "0" * 40,
        "patch": "diff --git a/x b/x\n",
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": json.dumps(["tests/test_new.py::test_new"]),  # JSON-encoded, as on the hub
        "PASS_TO_PASS": ["tests/test_a.py::test_x"],
        "image_name": "prebuilt:latest",
        "problem_statement": "kept as an extra column",
    }
    base.update(kw)
    return base


ROWS = [
    row(0),
    row(1, FAIL_TO_PASS="not json"),  # malformed field
    row(2, instance_id=""),  # empty id
    row(3, image_name=None),  # neither image nor source
    row(4, PASS_TO_PASS=[1, 2]),  # wrong element type
    row(5),
    row(0),  # duplicate id
]


def check_report(rep):
    assert [i.instance_id for i in rep.instances] == ["org__repo-0", "org__repo-5"]
    errs = {e.index: e for e in rep.errors}
    assert sorted(errs) == [1, 2, 3, 4, 6]
    assert errs[1].field == "FAIL_TO_PASS" and errs[1].instance_id == "org__repo-1"
    assert errs[2].field == "instance_id"
    assert errs[4].field.startswith("PASS_TO_PASS")
    assert "duplicate" in errs[6].message
    inst = rep.instances[0]
    assert inst.FAIL_TO_PASS == ["tests/test_new.py::test_new"]
    assert inst.problem_statement == "kept as an extra column"


def test_an_unknown_log_parser_is_the_rows_error_at_load_time(tmp_path):
    from swe_debug.parsers import register_parser

    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (row(0), row(1, log_parser="nosuch"))) + "\n")
    rep = load_instances(path)
    assert [i.instance_id for i in rep.instances] == ["org__repo-0"]
    (err,) = rep.errors
    assert err.index == 1 and err.instance_id == "org__repo-1" and err.field == "log_parser"
    assert "unknown log parser 'nosuch'" in err.message and "pytest" in err.message
    register_parser("nosuch", lambda log: None)  # registered before loading: accepted
    try:
        assert not load_instances(path).errors
    finally:
        from swe_debug import parsers

        parsers._PARSERS.pop("nosuch", None)


def test_jsonl_with_a_broken_line(tmp_path):
    p = tmp_path / "d.jsonl"
    lines = [json.dumps(r) for r in ROWS]
    lines.insert(3, "{not json")
    p.write_text("\n".join(lines) + "\n")
    rep = load_instances(p)
    assert [i.instance_id for i in rep.instances] == ["org__repo-0", "org__repo-5"]
    bad = [e for e in rep.errors if e.field == "<json>"]
    assert len(bad) == 1 and bad[0].index == 3 and "line 4" in bad[0].message


def test_json_and_parquet_and_datasets(tmp_path):
    pj = tmp_path / "d.json"
    pj.write_text(json.dumps(ROWS))
    check_report(load_instances(pj))

    import datasets

    # parquet columns need one type: keep the malformed-type row out of this one
    rows = [r for r in ROWS if r["instance_id"] != "org__repo-4"]
    rows = [{**r, "PASS_TO_PASS": json.dumps(r["PASS_TO_PASS"])} for r in rows]
    ds = datasets.Dataset.from_list(rows)
    pq = tmp_path / "d.parquet"
    ds.to_parquet(str(pq))
    rep = load_instances(pq)
    assert [i.instance_id for i in rep.instances] == ["org__repo-0", "org__repo-5"]
    assert {e.index for e in rep.errors} == {1, 2, 3, 5}
    rep2 = load_instances(ds)
    assert [i.instance_id for i in rep2.instances] == ["org__repo-0", "org__repo-5"]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"test": ds}).save_to_disk(str(saved))
    assert [i.instance_id for i in load_instances(saved).instances] == ["org__repo-0", "org__repo-5"]


def test_select_and_relative_sources(tmp_path):
    (tmp_path / "src.tar.gz").write_bytes(b"")
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(row(7, image_name=None, source={"archive": "src.tar.gz"})) + "\n")
    rep = load_instances(p)
    assert rep.instances[0].source.archive == str(tmp_path / "src.tar.gz")
    with pytest.raises(KeyError):
        rep.select(["nope"])
    assert rep.select(["org__repo-7"])[0].instance_id == "org__repo-7"


def test_patch_files_and_directives():
    assert patch_file_changes(TEST_PATCH) == [
        ("tests/test_a.py", "modified"), ("tests/test_new.py", "added"), ("tests/data.json", "deleted")]
    inst = SWEInstance.model_validate(row(0))
    assert inst.directives() == ["tests/test_a.py", "tests/test_new.py"]  # data files are not test targets
    assert inst.run_env()["PYTHONHASHSEED"] == "0"


def _row(example_id, iid, reward, verdict, error=None):
    info = {"instance_id": iid, "verdict": verdict}
    if iid != "c":
        info["repo"] = "o/r"
    return {"example_id": example_id, "info": info, "reward": reward, "error": error,
            "error_kind": error and error["kind"]}


def test_junit_is_well_formed_and_reads_back(tmp_path):
    rows = [
        _row(0, "a", 1.0, {"valid": True, "reason": "pass", "timings": {"total_s": 1.5}}),
        _row(1, "b", 0.0, {"valid": False, "reason": "test_failed", "detail": "1 FAIL_TO_PASS failing",
                           "stdout_tail": "\x1b[31mFAILED\x1b[0m t::x \x00 <&>", "timings": {"total_s": 2}}),
        _row(2, "c", 0.0, {"valid": False, "reason": "sandbox_error", "detail": "daemon gone"},
             error={"type": "SandboxCreateError", "message": "boom", "kind": "infra"}),
    ]
    meta = {"env_id": "swe-debug", "pass_threshold": 0.5,
            "input_errors": [{"name": "row 3", "type": "malformed_row", "message": "FAIL_TO_PASS: bad"}]}
    p = write_junit(tmp_path / "j.xml", rows, meta)
    root = ET.parse(p).getroot()
    suite = root.find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "2" and suite.get("errors") == "1"
    assert suite.get("time") == "3.500"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["a"].find("failure") is None and cases["a"].get("classname") == "o/r"
    f = cases["b"].find("failure")
    assert f.get("message").startswith("test_failed: 1 FAIL_TO_PASS failing")
    assert f.get("message").endswith("FAILED t::x  <&>")  # reason + log tail
    assert "FAILED t::x" in f.text and "<&>" in f.text and "\x1b" not in f.text
    e = cases["c"].find("error")
    assert e.get("type") == "sandbox_error" and "boom" in e.text and cases["c"].get("classname") == "swe-debug"
    assert cases["row 3"].find("failure").get("type") == "malformed_row"


def test_junit_of_a_plain_eval():
    """Rows without a verdict (any eval): a case per rollout, failing below the pass threshold."""
    from runner.junit import render_junit

    rows = [{"example_id": 0, "reward": 1.0}, {"example_id": 0, "reward": 0.2},
            {"example_id": 1, "reward": 0.0, "error": "ModelError: 500"}]
    root = render_junit(rows, {"env_id": "gsm8k", "pass_threshold": 0.5})
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert list(cases) == ["example 0#1", "example 0#2", "example 1"]
    assert cases["example 0#1"].find("failure") is None
    assert cases["example 0#2"].find("failure").get("message") == "reward: reward 0.2 < pass_threshold 0.5"
    assert cases["example 1"].find("error").text == "ModelError: 500"


def test_resume_reruns_only_unscored_rows_and_survives_a_torn_line(tmp_path):
    infra = {"type": "SandboxCreateError", "message": "daemon gone", "kind": "infra"}
    task = {"type": "ToolParseError", "message": "bad arguments", "kind": "task"}  # the model's: a scored failure
    w = ResultsWriter(tmp_path)
    w.append([{"example_id": 0, "reward": 1.0}])
    w.append([{"example_id": 1, "reward": 0.0, "error": infra, "error_kind": "infra"}])
    w.append([{"example_id": 2, "reward": 0.0, "error": task, "error_kind": "task"}])
    w.write_metadata({"env_id": "e"})
    w.close()
    with (tmp_path / "results.jsonl").open("a") as fh:
        fh.write('{"example_id": 3, "rew')  # killed mid-write
    rows, _ = load_existing(tmp_path)
    assert [r["example_id"] for r in rows] == [0, 1, 2]
    assert [needs_rerun(r) for r in rows] == [False, True, False]
    assert needs_rerun({"error": "SandboxCreateError: x", "error_info": {"kind": "infra"}})  # the newer row shape
    assert needs_rerun({"error": "ValueError: x", "error_info": {"type": "ValueError", "kind": "task"}})  # env's code
    assert needs_rerun({"error": "x", "verdict": "model"}) and not needs_rerun({"reward": 0.0, "verdict": "scored"})
    kept = [r for r in rows if not needs_rerun(r)]
    inputs = [{"example_id": i} for i in range(4)]
    assert missing_inputs(inputs, kept, 1) == [{"example_id": 1}, {"example_id": 3}]
    w = ResultsWriter(tmp_path)
    w.rewrite(kept)
    w.open()  # drops nothing more: the rewritten file ends in a newline
    w.append([{"example_id": 1, "reward": 1.0}])
    w.close()
    assert [json.loads(x)["example_id"] for x in (tmp_path / "results.jsonl").read_text().splitlines()] == [0, 2, 1]
