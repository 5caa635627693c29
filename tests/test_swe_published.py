"""Published SWE datasets read as published: one realistic row per shape (SWE-bench
Verified, SWE-Gym, SWE-smith, R2E-Gym, SWE-rebench V1/V2), written by the test to
the file types those datasets ship (parquet with JSON-string test lists, jsonl,
json, a hub-style directory of parquet shards read by `datasets.load_dataset`, a
`save_to_disk` directory) and mapped per `swe_debug.published.SHAPES`; rows that
fit no shape, or miss a column their shape needs, are load-time errors naming the
row and the column. No network to the Hugging Face hub here: hub loading is
exercised through `datasets.load_dataset` on a local directory laid out like a
hub dataset repo (`data/<split>-*.parquet`), the code path a hub name takes
after download.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from test_swe_docker import examples, instances  # noqa: F401 - session fixtures of the SWE suite

ROOT = Path(__file__).resolve().parent.parent

DJANGO_TEST_PATCH = """diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py
--- a/tests/auth_tests/test_validators.py
+++ b/tests/auth_tests/test_validators.py
@@ -237,7 +237,7 @@ def test_unicode_validator(self):
         invalid_usernames = [
             "o'connell", "عبد ال",
             "zerowidth\\u200Bspace", "nonbreaking\\u00A0space",
-            "en\\u2013dash",
+            "en\\u2013dash", 'trailingnewline\\u000A',
         ]
"""
DJANGO_PATCH = """diff --git a/django/contrib/auth/validators.py b/django/contrib/auth/validators.py
--- a/django/contrib/auth/validators.py
+++ b/django/contrib/auth/validators.py
@@ -7,7 +7,7 @@
 @deconstructible
 class ASCIIUsernameValidator(validators.RegexValidator):
-    regex = r'^[\\w.@+-]+$'
+    regex = r'^[\\w.@+-]+\\Z'
"""

VERIFIED_ROW = {
    "repo": "django/django", "instance_id": "django__django-11099",
    "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c", "patch": DJANGO_PATCH, "test_patch": DJANGO_TEST_PATCH,
    "problem_statement": "UsernameValidator allows trailing newline in usernames", "hints_text": "",
    "created_at": "2019-03-20T03:46:18Z", "version": "3.0",
    "FAIL_TO_PASS": json.dumps(["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)",
                                "test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)"]),
    "PASS_TO_PASS": json.dumps(["test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)"]),
    "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27", "difficulty": "<15 min fix",
}

GYM_ROW = {
    "instance_id": "getmoto__moto-5752", "hints_text": "", "created_at": "2022-12-10T20:23:01Z",
    "patch": "diff --git a/moto/ssm/models.py b/moto/ssm/models.py\n--- a/moto/ssm/models.py\n+++ b/moto/ssm/models.py\n"
             "@@ -1,1 +1,1 @@\n-x = 1\n+x = 2\n",
    "test_patch": "diff --git a/tests/test_ssm/test_ssm_boto3.py b/tests/test_ssm/test_ssm_boto3.py\n"
                  "--- a/tests/test_ssm/test_ssm_boto3.py\n+++ b/tests/test_ssm/test_ssm_boto3.py\n@@ -1,1 +1,1 @@\n-a\n+b\n",
    "problem_statement": "Regex in SSM get_parameters_by_path", "repo": "getmoto/moto",
    "base_commit": "b2300f1eae1323e3e8bc45f97e530ce129dff12e", "version": "4.0",
    "PASS_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_get_parameters_by_path"],
    "FAIL_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_get_parameter_with_regex"],
}

SMITH_BUG = ("diff --git a/src/idna/core.py b/src/idna/core.py\n--- a/src/idna/core.py\n+++ b/src/idna/core.py\n"
             "@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n")
SMITH_ROW = {
    "instance_id": "kjd__idna.d8fd8e3a.func_pm_op_swap__3k2b1a9x", "patch": SMITH_BUG,
    "FAIL_TO_PASS": ["tests/test_idna.py::IDNATests::test_encode"], "PASS_TO_PASS": ["tests/test_idna.py::IDNATests::test_decode"],
    "image_name": "jyangballin/swesmith.x86_64.kjd_1776_idna.d8fd8e3a", "repo": "swesmith/kjd__idna.d8fd8e3a",
    "problem_statement": "encode() swaps operands",
}

R2E_COMMIT = {
    "old_commit_hash": "aaa", "new_commit_hash": "bbb", "commit_message": "Fix rounding", "commit_date": "2019-01-01",
    "file_diffs": [
        {"header": {"file": {"path": "Orange/data/table.py"}, "misc_line": None},
         "index_line": {"old_commit_hash": "1111111", "new_commit_hash": "2222222", "mode": "100644"},
         "is_binary_file": False, "binary_line": None,
         "minus_file": {"path": "a/Orange/data/table.py"}, "plus_file": {"path": "b/Orange/data/table.py"},
         "hunks": [{"descriptor": {"old_range": {"start": 10, "length": 3}, "new_range": {"start": 10, "length": 3},
                                   "section": "def round_it(x):"},
                    "line_group": {"all_lines": [{"content": "    y = x", "type": "context"},
                                                 {"content": "    return int(y)", "type": "deleted"},
                                                 {"content": "    return round(y)", "type": "added"},
                                                 {"content": "", "type": "context"}]}}]},
        {"header": {"file": {"path": "Orange/tests/test_table.py"}, "misc_line": None}, "index_line": None,
         "is_binary_file": False, "minus_file": {"path": "a/Orange/tests/test_table.py"},
         "plus_file": {"path": "b/Orange/tests/test_table.py"},
         "hunks": [{"descriptor": {"old_range": {"start": 1, "length": 1}, "new_range": {"start": 1, "length": 2}, "section": ""},
                    "line_group": {"all_lines": [{"content": "import x", "type": "context"},
                                                 {"content": "import y", "type": "added"}]}}]},
    ],
}
R2E_ROW = {
    "repo_name": "orange3", "docker_image": "namanjain12/orange3_final:8f4c7d0e5a",
    "commit_hash": "8f4c7d0e5a2b9d6f1c3e4a5b6c7d8e9f0a1b2c3d", "parsed_commit_content": json.dumps(R2E_COMMIT),
    "execution_result_content": "{}", "modified_files": ["Orange/data/table.py"], "relevant_files": [],
    "num_non_test_files": 1, "num_non_test_func_methods": 1, "num_non_test_lines": 2,
    "prompt": "", "problem_statement": "[ISSUE]round_it truncates[/ISSUE]",
    "expected_output_json": json.dumps({"TestTable.test_round": "PASSED", "TestTable.test_other": "PASSED",
                                        "\u001b[31mTestTable.test_known_bad\u001b[0m": "FAILED"}),
}

REBENCH_ROW = {
    "instance_id": "oemof__tespy-653", "base_commit": "1c5f2f0d1e9a", "created_at": "2025-02-01",
    "environment_setup_commit": "1c5f2f0d1e9a", "hints_text": "", "patch": DJANGO_PATCH.replace("django/contrib/auth", "src/tespy"),
    "problem_statement": "x", "repo": "oemof/tespy", "test_patch": GYM_ROW["test_patch"], "version": "0.7",
    "install_config": {"install": "pip install -e .", "log_parser": "parse_log_pytest", "python": "3.10",
                       "test_cmd": "pytest --no-header -rA --tb=no -p no:cacheprovider -W ignore::DeprecationWarning"},
    "FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": ["tests/test_x.py::test_b"],
    "docker_image": "swerebench/sweb.eval.x86_64.oemof_1776_tespy-653", "license_name": "MIT",
    "meta": {"has_test_patch": True, "is_lite": False}, "requirements": "", "environment": "",
}

REBENCH_V2_ROW = {
    **{k: v for k, v in REBENCH_ROW.items() if k not in ("docker_image", "install_config")},
    "instance_id": "BurntSushi__ripgrep-2576", "repo": "BurntSushi/ripgrep", "language": "rust", "license": "MIT",
    "image_name": "swerebench/sweb.eval.x86_64.burntsushi_1776_ripgrep-2576",
    "install_config": json.dumps({"test_cmd": ["cargo test --no-fail-fast", "cargo test --doc"],
                                  "log_parser": "parse_log_cargo", "install": ["cargo build"]}),
    "FAIL_TO_PASS": json.dumps(["regression::r2576"]), "PASS_TO_PASS": json.dumps([]),
}


def _write_parquet(rows, path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_swe_bench_verified_parquet_maps_through_the_harness_specs(tmp_path):
    """SWE-bench Verified as the hub stores it (parquet, JSON-string test lists): recognised
    by `environment_setup_commit`; its test command, Django's dotted test modules and the
    Django log parser come from the swebench package's per-repo specs."""
    from swe_debug.instances import load_instances

    rep = load_instances(_write_parquet([VERIFIED_ROW], tmp_path / "verified.parquet"), named_images=True)
    assert not rep.errors, rep.errors
    (inst,) = rep.instances
    assert inst.dataset_format == "swe-bench"
    assert inst.FAIL_TO_PASS[1] == "test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)"
    assert inst.test_cmd.startswith("source /opt/miniconda3/bin/activate && conda activate testbed; ")
    assert inst.test_cmd.endswith("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1")
    assert "export LANG=en_US.UTF-8" in inst.test_cmd  # the spec's eval_commands, before the tests
    assert "; python -m pip install -e .; ./tests/runtests.py" in inst.test_cmd  # and its re-install, as the harness
    assert inst.directives() == ["auth_tests.test_validators"]
    assert inst.log_parser == "swebench:django/django"
    from sandboxes.images import host_arch
    from swe_debug.images import ImageBuilder

    assert ImageBuilder(namespace="swebench").remote_image(inst) == \
        f"swebench/sweb.eval.{host_arch().swebench}.django_1776_django-11099:latest"
    assert inst.difficulty == "<15 min fix"  # unknown columns kept


def test_swe_gym_jsonl_named_format(tmp_path):
    """SWE-Gym (lists, no environment_setup_commit) is the SWE-bench schema: named with
    --dataset-format; a repo the harness has no spec for keeps pytest."""
    from swe_debug.instances import DEFAULT_TEST_CMD, load_instances
    from swe_debug.published import CONDA_PATH

    path = tmp_path / "gym.jsonl"
    path.write_text(json.dumps(GYM_ROW) + "\n")
    rep = load_instances(path, named_images=True, dataset_format="swe-gym")
    assert not rep.errors, rep.errors
    (inst,) = rep.instances
    assert inst.dataset_format == "swe-gym" and inst.log_parser == "pytest"
    assert inst.test_cmd == DEFAULT_TEST_CMD and inst.test_path[0] == CONDA_PATH[0] == "/opt/miniconda3/envs/testbed/bin"
    assert inst.FAIL_TO_PASS == GYM_ROW["FAIL_TO_PASS"] and inst.directives() == ["tests/test_ssm/test_ssm_boto3.py"]
    # SWE-Gym's own images under --namespace: `__` spelled `_s_` (SWE-bench's: `_1776_`)
    from sandboxes.images import host_arch
    from swe_debug.images import ImageBuilder

    arch = host_arch().swebench
    assert ImageBuilder(namespace="xingyaoww").remote_image(inst) == f"xingyaoww/sweb.eval.{arch}.getmoto_s_moto-5752:latest"
    assert inst.keep_untracked  # a published image's untracked files are its state
    # the same row without a column SWE-Gym publishes: the row and the column are named
    path.write_text(json.dumps({k: v for k, v in GYM_ROW.items() if k != "base_commit"}) + "\n")
    rep = load_instances(path, named_images=True, dataset_format="swe-gym")
    assert not rep.instances and str(rep.errors[0]).startswith("row 0 (getmoto__moto-5752): base_commit: missing")


def test_swe_smith_json_bug_is_the_setup_and_its_reverse_the_gold(tmp_path):
    from swe_debug.instances import load_instances
    from swe_debug.published import reverse_patch

    path = tmp_path / "smith.json"
    path.write_text(json.dumps([SMITH_ROW]))
    rep = load_instances(path)
    assert not rep.errors, rep.errors
    (inst,) = rep.instances
    assert inst.dataset_format == "swe-smith" and inst.image_name == SMITH_ROW["image_name"]
    assert inst.setup_patch == SMITH_BUG and inst.patch == reverse_patch(SMITH_BUG) != SMITH_BUG
    assert "-B\n+b" in inst.patch and inst.test_patch == "" and inst.directives() == []
    bad = {k: v for k, v in SMITH_ROW.items() if k != "image_name"}
    path.write_text(json.dumps([bad]))
    rep = load_instances(path, dataset_format="swe-smith")
    assert str(rep.errors[0]).startswith(f"row 0 ({SMITH_ROW['instance_id']}): image_name: missing")


def test_reverse_patch_undoes_a_real_git_diff(tmp_path):
    """reverse_patch against real git: modified, added (no trailing newline), deleted and
    renamed files; applying the diff then its reverse gives back the original tree."""
    from swe_debug.published import reverse_patch

    repo = tmp_path / "r"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout  # noqa: E731
    git("init", "-q")
    (repo / "a.py").write_text("".join(f"line {i}\n" for i in range(30)))
    (repo / "gone.py").write_text("bye\n")
    (repo / "old_name.py").write_text("".join(f"keep {i}\n" for i in range(20)))
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (repo / "a.py").write_text("".join(f"line {i}\n" if i % 7 else f"-- changed {i}\n" for i in range(30)))
    (repo / "new.py").write_text("hello\nno newline")
    (repo / "gone.py").unlink()
    git("mv", "old_name.py", "new_name.py")
    (repo / "new_name.py").write_text("".join(f"keep {i}\n" for i in range(19)) + "changed\n")
    git("add", "-A")
    diff = git("diff", "--cached", "-M")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "change")
    (tmp_path / "rev.diff").write_text(reverse_patch(diff))
    git("apply", "--check", str(tmp_path / "rev.diff"))
    git("apply", str(tmp_path / "rev.diff"))
    git("add", "-A")
    assert git("diff", "--cached", "HEAD~1", "--stat") == ""  # back to the base tree exactly
    (tmp_path / "fwd.diff").write_text(diff)
    git("apply", "--check", str(tmp_path / "fwd.diff"))  # the forward diff applies again
    with pytest.raises(subprocess.CalledProcessError):  # and the reverse no longer does
        git("apply", "--check", str(tmp_path / "rev.diff"))


def test_r2e_gym_hub_style_directory_via_datasets(tmp_path):
    """R2E-Gym as a hub dataset repo (data/train-*.parquet) read by datasets.load_dataset:
    the gold patch rebuilt from parsed_commit_content (non-test files only), the tests
    expected PASSED as FAIL_TO_PASS in R2E's id form, the image from docker_image."""
    from swe_debug.instances import load_instances

    repo = tmp_path / "R2E-Gym-Lite"
    _write_parquet([R2E_ROW], repo / "data" / "train-00000-of-00001.parquet")
    rep = load_instances(repo, split="train")
    assert not rep.errors, rep.errors
    (inst,) = rep.instances
    assert inst.dataset_format == "r2e-gym" and inst.instance_id == f"orange3-{R2E_ROW['commit_hash']}"
    assert inst.image_name == R2E_ROW["docker_image"] and inst.repo == "orange3"
    assert inst.patch == ("diff --git a/Orange/data/table.py b/Orange/data/table.py\nindex 1111111..2222222 100644\n"
                          "--- a/Orange/data/table.py\n+++ b/Orange/data/table.py\n@@ -10,3 +10,3 @@ def round_it(x):\n"
                          "     y = x\n-    return int(y)\n+    return round(y)\n \n")
    assert inst.FAIL_TO_PASS == ["TestTable.test_other", "TestTable.test_round"] and inst.PASS_TO_PASS == []
    assert inst.test_cmd == "bash run_tests.sh" and inst.directives() == [] and inst.test_path[0] == "/testbed/.venv/bin" and inst.log_parser == "r2e-pytest"
    assert any("/r2e_tests" in c for c in inst.setup_commands)
    # R2E's parser ids: the file dropped, `::` → `.`
    from swe_debug.parsers import get_parser

    log = ("=== short test summary info ===\nPASSED r2e_tests/test_1.py::TestTable::test_round\n"
           "FAILED r2e_tests/test_1.py::TestTable::test_other - assert 1 == 2\n=== 1 failed, 1 passed in 0.1s ===\n")
    assert get_parser("r2e-pytest")(log).statuses == {"TestTable.test_round": "PASSED", "TestTable.test_other": "FAILED"}


def test_swe_rebench_parquet_and_v2_save_to_disk(tmp_path):
    """SWE-rebench V1 (install_config a struct column, docker_image) from parquet and V2
    (install_config a JSON string with a list of test commands, language, image_name) from
    a datasets save_to_disk directory: test_cmd and the named swebench parser from
    install_config, no directives appended, V2 in /<repo name>."""
    import datasets

    from swe_debug.instances import load_instances

    rep = load_instances(_write_parquet([REBENCH_ROW], tmp_path / "rebench.parquet"))
    assert not rep.errors, rep.errors
    (v1,) = rep.instances
    assert v1.dataset_format == "swe-rebench" and v1.image_name == REBENCH_ROW["docker_image"]
    assert v1.test_cmd == REBENCH_ROW["install_config"]["test_cmd"] and v1.directives() == []
    assert v1.log_parser == "parse_log_pytest" and v1.workdir == "/testbed"

    datasets.Dataset.from_list([REBENCH_V2_ROW]).save_to_disk(str(tmp_path / "v2"))
    rep = load_instances(tmp_path / "v2")
    assert not rep.errors, rep.errors
    (v2,) = rep.instances
    assert v2.workdir == "/ripgrep" and v2.log_parser == "parse_log_cargo" and v2.FAIL_TO_PASS == ["regression::r2576"]
    assert "cargo test --no-fail-fast" in v2.test_cmd and "cargo test --doc" in v2.test_cmd
    # every command runs and the status is the highest of theirs (real bash)
    from swe_debug.published import normalize_row

    def status(cmds):
        row = {**REBENCH_V2_ROW, "install_config": {"test_cmd": cmds, "log_parser": "parse_log_cargo"}}
        return subprocess.run(["bash", "-c", normalize_row(row)["test_cmd"]], capture_output=True, text=True)

    r = status(["echo one; (exit 2)", "echo two; (exit 1)", "echo three"])
    assert r.returncode == 2 and r.stdout.split() == ["one", "two", "three"]
    assert status(["true", "true"]).returncode == 0 and status(["true", "false"]).returncode == 1


def test_unknown_shapes_and_missing_columns_are_load_errors_naming_row_and_field(tmp_path):
    from swe_debug.instances import load_instances

    rows = [
        {"id": "x-1", "diff": "..."},                                            # no shape at all
        {**REBENCH_ROW, "instance_id": "rb-1", "install_config": {"log_parser": "parse_log_pytest"}},
        {**REBENCH_ROW, "instance_id": "rb-2", "install_config": {"test_cmd": "pytest", "log_parser": "parse_log_nope"}},
        {k: v for k, v in R2E_ROW.items() if k != "expected_output_json"},
        {**R2E_ROW, "parsed_commit_content": "{\"nope\": 1}"},
        {**VERIFIED_ROW, "instance_id": "v-1", "FAIL_TO_PASS": "[not json"},
        {k: v for k, v in VERIFIED_ROW.items() if k != "test_patch"},
        {**GYM_ROW, "image_name": "img"},                                        # native: loads
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = load_instances(path)
    assert [i.instance_id for i in rep.instances] == ["getmoto__moto-5752"]
    errs = {e.index: e for e in rep.errors}
    assert errs[0].field == "instance_id" and "matches none of the published shapes" in errs[0].message
    assert "its columns: diff, id" in errs[0].message
    assert (errs[1].instance_id, errs[1].field) == ("rb-1", "install_config.test_cmd")
    assert errs[2].field == "log_parser" and "unknown log parser 'parse_log_nope'" in errs[2].message
    assert (errs[3].instance_id, errs[3].field) == (R2E_ROW["commit_hash"], "expected_output_json")
    assert errs[4].field == "parsed_commit_content"
    assert errs[5].field == "FAIL_TO_PASS" and "not a JSON list" in errs[5].message
    assert (errs[6].instance_id, errs[6].field) == ("django__django-11099", "test_patch")
    with pytest.raises(ValueError, match="unknown dataset format 'swe-bench-pro'"):
        load_instances(path, dataset_format="swe-bench-pro")


def test_readme_mapping_table_is_the_data():
    """The README's table is rendered from swe_debug.published.SHAPES (so it stays true)."""
    from swe_debug.published import mapping_table

    assert mapping_table() in (ROOT / "swe_debug" / "README.md").read_text()


# --------------------------------------------------------------------------- end to end on Docker


@pytest.mark.docker
async def test_swe_smith_row_runs_end_to_end_on_docker(instances, tmp_path):
    """A SWE-smith-shaped row on a REAL image in SWE-smith's layout (the repo with the fix
    and its tests committed: a clean tree that passes) and the bug as its `patch`: the
    setup step applies the bug, the gold (its reverse) fixes it, the whole suite runs;
    without the gold every FAIL_TO_PASS test fails (--check-fails-before)."""
    import uuid

    import docker

    from swe_debug.images import ImageBuilder
    from swe_debug.instances import load_instances
    from swe_debug.published import reverse_patch
    from swe_debug.taskset import SWETaskSet
    from test_swe_docker import IDNA, _run

    inst = instances[IDNA]
    base = (await ImageBuilder().ensure(inst)).tag
    script = (f"set -e; cd /testbed\ncat > /tmp/g.diff <<'EOF_VF_GOLD'\n{inst.patch}\nEOF_VF_GOLD\n"
              f"cat > /tmp/t.diff <<'EOF_VF_TEST'\n{inst.test_patch}\nEOF_VF_TEST\n"
              "git apply /tmp/g.diff && git apply /tmp/t.diff && rm /tmp/*.diff && git add -A && "
              "git -c user.name=s -c user.email=s@s commit -qm 'SWE-smith: clean repo' && "
              "echo 'untracked, as published images have' > run_tests.sh")  # kept by setup (keep_untracked)
    client = docker.from_env()
    repo, tag = "vf-swe-test/swesmith.x86_64.kjd_1776_idna", uuid.uuid4().hex[:12]
    c = client.containers.run(base, ["bash", "-c", script], detach=True, network_disabled=True)
    try:
        assert c.wait()["StatusCode"] == 0, c.logs().decode()
        c.commit(repository=repo, tag=tag)
    finally:
        c.remove(force=True)
    try:
        row = {"instance_id": "kjd__idna.d8fd8e3a.revert_fix__vf", "patch": reverse_patch(inst.patch),
               "FAIL_TO_PASS": inst.FAIL_TO_PASS, "PASS_TO_PASS": inst.PASS_TO_PASS, "image_name": f"{repo}:{tag}",
               "repo": "swesmith/kjd__idna.d8fd8e3a", "problem_statement": "x"}
        # a bug that breaks nothing: its F2P test already passes without the "gold"
        harmless = {**row, "instance_id": "kjd__idna.harmless", "patch": "diff --git a/HARMLESS.txt b/HARMLESS.txt\n"
                    "new file mode 100644\n--- /dev/null\n+++ b/HARMLESS.txt\n@@ -0,0 +1 @@\n+harmless\n"}
        path = tmp_path / "smith.jsonl"
        path.write_text(json.dumps(row) + "\n" + json.dumps(harmless) + "\n")
        rep = load_instances(path)
        assert not rep.errors and [i.dataset_format for i in rep.instances] == ["swe-smith", "swe-smith"], rep.errors
        rows = await _run(instances, [], taskset=SWETaskSet(rep.instances), check_fails_before=True, concurrency=2)
        ok = rows[row["instance_id"]]
        assert ok["valid"] and ok["reason"] == "pass", {k: ok[k] for k in ("detail", "stdout_tail", "stderr_tail", "test_exit_code")}
        assert ok["fails_before"]["ok"], ok["fails_before"]
        bad = rows["kjd__idna.harmless"]
        assert not bad["valid"] and bad["fails_before"]["passing_before"] == inst.FAIL_TO_PASS, bad
    finally:
        client.images.remove(f"{repo}:{tag}", force=True)
        client.close()



def test_cli_dataset_format_reaches_the_run_definition_and_a_wrong_one_exits_2(tmp_path):
    import sys

    from swe_debug.cli import Step, env_args, eval_config

    path = tmp_path / "smith.jsonl"
    path.write_text(json.dumps(SMITH_ROW) + "\n")
    args = {"dataset": str(path), "split": "test", "instance_ids": None, "debug_step": Step.gold_patch,
            "debug_command": None, "debug_script_path": None, "debug_timeout": None, "test_timeout": 900,
            "timeout_seconds": 1800, "check_fails_before": False, "repeat": 1, "no_setup": False, "no_tests": False,
            "output_tail_chars": 2000, "cpu_cores": None, "memory_gb": None, "namespace": None, "push_to": None,
            "keep_images": None, "dataset_format": "swe-smith", "concurrency": 1, "max_retries": 0, "output_dir": None,
            "resume": False, "name": None, "junit_xml": None, "backend": "docker", "timeout_minutes": 10, "isolation": None}
    assert env_args(args)["dataset_format"] == "swe-smith"
    cfg = eval_config(args)  # the run definition (serialisable, what --resume compares) carries it
    assert cfg.env_args["dataset_format"] == "swe-smith" and '"dataset_format":"swe-smith"' in cfg.model_dump_json()
    res = subprocess.run([sys.executable, "-m", "swe_debug.cli", str(path), "--dataset-format", "swe-bench-pro", "-q"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 2 and "unknown dataset format 'swe-bench-pro'" in res.stdout + res.stderr, res


@pytest.mark.docker
async def test_eval_script_rows_run_their_own_script_on_docker(instances, tmp_path):
    """A swebench-5.x-shaped row (its own `eval_script`, `image`, `log_parser` by the
    harness's function name) on the REAL idna image: the script resets and applies the
    test patch itself; the test command's own exit code is recorded after the end marker
    (the script's is its last `git checkout`'s) and the log is parsed between markers.
    Gold → valid; no patch → test_failed; a script whose tests exit 4 with nothing failing
    → no_tests_ran (the exit code is the test command's, not the script's 0)."""
    from swe_debug.images import ImageBuilder
    from swe_debug.instances import load_instances
    from swe_debug.taskset import SWETaskSet
    from test_swe_docker import IDNA, _run

    inst = instances[IDNA]
    image = (await ImageBuilder().ensure(inst)).tag
    files = " ".join(inst.directives())

    def script(test: str) -> str:
        return "\n".join([
            "#!/bin/bash", "set -uxo pipefail", "cd /testbed", "git status", f"git checkout {inst.base_commit} {files}",
            f"git apply -v - <<'EOF_114329324912'\n{inst.test_patch}\nEOF_114329324912",
            ": '>>>>> Start Test Output'", test, ": '>>>>> End Test Output'", f"git checkout {inst.base_commit} {files}",
        ])

    row = {"instance_id": "kjd__idna-3.4", "repo": "kjd/idna", "version": "3.4", "base_commit": inst.base_commit,
           "patch": inst.patch, "test_patch": inst.test_patch, "image": image, "log_parser": "parse_log_pytest",
           "eval_type": "pass_and_fail", "FAIL_TO_PASS": json.dumps(inst.FAIL_TO_PASS),
           "PASS_TO_PASS": json.dumps(inst.PASS_TO_PASS),
           "eval_script": script(f"python -m pytest -rA --color=no -p no:cacheprovider {files}")}
    nothing = {**row, "instance_id": "kjd__idna-exit4", "eval_script": script(
        f"python -m pytest -rA --color=no -p no:cacheprovider {files}; exit_code=4; (exit $exit_code)")}
    path = tmp_path / "v5.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(nothing) + "\n")
    rep = load_instances(path)
    assert not rep.errors and {i.dataset_format for i in rep.instances} == {"swe-bench-v5"}, rep.errors
    ts = SWETaskSet(rep.instances)
    gold = await _run(instances, [], taskset=ts, concurrency=2)
    assert gold[IDNA]["valid"] and gold[IDNA]["reason"] == "pass" and gold[IDNA]["test_exit_code"] == 0, gold[IDNA]
    assert gold["kjd__idna-exit4"]["reason"] == "no_tests_ran" and gold["kjd__idna-exit4"]["test_exit_code"] == 4
    none = await _run(instances, [], taskset=SWETaskSet(rep.instances[:1]), debug_step="none")
    assert none[IDNA]["reason"] == "test_failed" and none[IDNA]["test_exit_code"] == 1, none[IDNA]


@pytest.mark.docker
def test_example_taskset_in_the_published_schema_runs_from_a_hub_style_parquet_dir(instances, tmp_path):
    """The example taskset written as SWE-bench publishes it (only its columns, JSON-string
    test lists, environment_setup_commit; the image by name), as a hub dataset repo
    (data/test-*.parquet), through `datasets.load_dataset` and the vf-swe-debug CLI:
    every instance valid, exit 0, a JUnit report with no failure."""
    import sys
    import xml.etree.ElementTree as ET

    from sandboxes.images import run_sync
    from swe_debug.images import ImageBuilder
    from test_swe_docker import DATEUTIL, IDNA, MORE

    rows = []
    for iid in (IDNA, DATEUTIL, MORE):
        inst = instances[iid]
        row = {"repo": inst.repo, "instance_id": iid, "base_commit": inst.base_commit, "patch": inst.patch,
               "test_patch": inst.test_patch, "problem_statement": "", "hints_text": "", "created_at": "2024-01-01",
               "version": inst.version, "FAIL_TO_PASS": json.dumps(inst.FAIL_TO_PASS),
               "PASS_TO_PASS": json.dumps(inst.PASS_TO_PASS), "environment_setup_commit": inst.base_commit,
               "image_name": run_sync(lambda inst=inst: ImageBuilder().ensure(inst)).tag,
               # the one instance not run by pytest names its runner (a repo the harness has no spec for)
               "test_cmd": inst.test_cmd, "log_parser": inst.log_parser,
               "test_directives": inst.test_directives}
        rows.append(row)
    repo = tmp_path / "SWE-bench_examples"
    _write_parquet(rows, repo / "data" / "test-00000-of-00001.parquet")
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    res = subprocess.run([sys.executable, "-m", "swe_debug.cli", str(repo), "--split", "test", "-c", "3", "-q",
                          "-o", str(out), "--junit-xml", str(junit)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**__import__("os").environ, "VF_RUNS_DB": str(tmp_path / "runs.db")})
    assert res.returncode == 0, res.stdout + res.stderr
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("tests")) == 3 and int(suite.get("failures", 0)) == 0 and int(suite.get("errors", 0)) == 0
