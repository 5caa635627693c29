"""The options of `vf-swe-debug`, declared once: each is a pydantic field with an `Opt`
marker (`runner.options`), as `vf-sandbox eval`'s settings are. The command's flags,
their help and defaults are generated from these fields (`swe_debug.cli.run`), and the
values given are validated by this model (a value out of range is a usage error, exit 2).
The sandbox flags (`--cpu-cores`, `--memory-gb`, `--isolation`, `--rollout-isolation`) take
their types and constraints from the view onto `SandboxSpec` (`swe_debug.debug.DebugOptions`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from runner.options import Opt

from .debug import DebugOptions


class Step(str, Enum):
    none = "none"
    gold_patch = "gold_patch"
    command = "command"
    script = "script"
    oracle = "oracle"  # Harbor tasks (`harbor:<dir>`): solution/solve.sh, then the tests


def _o(flag: str, short: str | None = None, help: str = "", **kw: object) -> Opt:
    return Opt(flag, short, help=help, toml=False, **kw)  # type: ignore[arg-type]


def _sandbox(field: str) -> object:
    """The type of the sandbox override `field`: SandboxSpec's, constraints included, or None."""
    return DebugOptions.model_fields[field].annotation


_CPU_CORES, _MEMORY_GB, _ISOLATION, _ROLLOUT_ISOLATION = map(_sandbox, ("cpu_cores", "memory_gb", "isolation",
                                                                        "rollout_isolation"))


class SWEDebugOptions(BaseModel):
    """Everything `vf-swe-debug DATASET ...` takes (the dataset is the positional argument)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(description="A .json/.jsonl/.parquet file, a `datasets` save_to_disk dir or a hub name; "
                         "`harbor:DIR` for Harbor task directories (docs/harbor-tasks.md).")
    split: Annotated[str, _o("--split", help="Split of a hub dataset or DatasetDict.")] = "test"
    dataset_format: Annotated[Optional[str], _o(
        "--dataset-format", help="Published shape of the rows: swe-bench, swe-bench-v5, swe-gym, swe-smith, r2e-gym, "
        "swe-rebench or native (default: recognised per row by its columns; see swe_debug/README.md).")] = None
    instance_ids: Annotated[Optional[list[str]], _o(
        "--instance-ids", "-i", help="Only these ids (repeat or comma-separate).")] = None
    debug_step: Annotated[Step, _o("--debug-step", help="What to do before the tests.")] = Step.gold_patch
    debug_command: Annotated[Optional[str], _o("--debug-command", help="Shell command for --debug-step command.")] = None
    debug_script_path: Annotated[Optional[Path], _o(
        "--debug-script-path", help="Script for --debug-step script.")] = None
    debug_timeout: Annotated[Optional[float], _o(
        "--debug-timeout", help="Seconds for the debug command/script (default: --test-timeout).")] = None
    concurrency: Annotated[int, _o("--concurrency", "-c", help="Instances at once.")] = Field(4, ge=1)
    max_retries: Annotated[int, _o(
        "--max-retries", help="Extra tries of a rollout after a sandbox (infra) error.")] = Field(2, ge=0)
    test_timeout: Annotated[float, _o("--test-timeout", help="Seconds for the test run.")] = 900
    timeout_seconds: Annotated[float, _o(
        "--timeout-seconds", help="Seconds for one debug run of an instance.")] = 1800
    timeout_minutes: Annotated[float, _o(
        "--timeout-minutes", help="Minutes for the whole run (then it stops: finished rows kept, --resume).")] = 1440
    output_dir: Annotated[Optional[Path], _o(
        "--output-dir", "-o", help="Base directory of the run (default outputs); results go to "
        "OUTPUT_DIR/evals/swe-debug--none/<run>/.")] = None
    junit_xml: Annotated[Optional[Path], _o("--junit-xml", help="Write a JUnit XML report here.")] = None
    resume: Annotated[Optional[str], _o(
        "--resume", help="Continue a run: its run id or results directory, or, with no value, the newest unfinished "
        "run of these flags in the run registry (instances not scored run again).")] = None
    backend: Annotated[str, _o("--backend", help="Sandbox backend: docker, local, kubernetes, prime, ...")] = "docker"
    check_fails_before: Annotated[bool, _o(
        "--check-fails-before", help="Also run without the patch; every FAIL_TO_PASS test must fail there.")] = False
    repeat: Annotated[int, _o(
        "--repeat", help="Gold runs per instance; mixed verdicts are reported `flaky`.")] = Field(1, ge=1)
    no_setup: Annotated[bool, _o("--no-setup", help="Skip the setup step.")] = False
    no_tests: Annotated[bool, _o("--no-tests", help="Stop after the debug step.")] = False
    output_tail_chars: Annotated[int, _o(
        "--output-tail-chars", help="Chars of stdout/stderr kept per row.")] = Field(2000, ge=0)
    cpu_cores: Annotated[_CPU_CORES, _o(
        "--cpu-cores", help="CPU cores per sandbox (default: the instance's spec).", cli_type=float)] = None
    memory_gb: Annotated[_MEMORY_GB, _o(
        "--memory-gb", help="Memory (GiB) per sandbox (default: the instance's spec).", cli_type=float)] = None
    namespace: Annotated[Optional[str], _o(
        "--namespace", help="Registry namespace of SWE-bench instance images (e.g. swebench, or host:port/ns): rows "
        "without an image field run {namespace}/sweb.eval.<arch>.<id>, pulled. Credentials: VF_REGISTRY_USERNAME / "
        "VF_REGISTRY_PASSWORD or the Docker config.")] = None
    registry: Annotated[Optional[str], _o(
        "--registry", help="Registry host[:port] of SWE-bench instance images: rows without an image field run "
        "{registry}/{namespace}/sweb.eval.<arch>.<id> (--namespace default: swebench). Rows naming their image are "
        "used as named.")] = None
    push_to: Annotated[Optional[str], _o(
        "--push-to", help="Push instance images built here to this registry (host:port or host:port/ns), so other "
        "machines, Kubernetes and Ray nodes pull them by name.")] = None
    keep_images: Annotated[Optional[int], _o(
        "--keep-images", help="Disk bound: of the images this run pulls or builds, keep at most N (least recently "
        "used removed first; never an image in use or one the run did not make). Default: keep all.")] = Field(None, ge=0)
    rollout_isolation: Annotated[_ROLLOUT_ISOLATION, _o(
        "--rollout-isolation", help="Each instance in a new container (`container`) or in a cell of a pooled "
        "container of its image (`namespace`: private overlay, namespaces, cgroup limits; see README) "
        "\\[default: container].", cli_type=str)] = None
    setup_scope: Annotated[Optional[Literal["rollout", "group"]], _o(
        "--setup-scope", help="`group`: an instance's image and setup once, then each attempt (--repeat, "
        "--check-fails-before) in a fork of that prepared sandbox (cells: milliseconds; containers: an engine "
        "commit); `rollout`: setup per attempt \\[default: rollout].")] = None
    isolation: Annotated[_ISOLATION, _o(
        "--isolation", help="Kernel boundary of the sandboxes: runc or gvisor (docker: the engine's runsc runtime) "
        "\\[default: runc].", cli_type=str)] = None
    name: Annotated[Optional[str], _o(
        "--eval-name", help="Run name in the run registry (default: the dataset's name and the debug step).",
        aliases=("--name",))] = None
    quiet: Annotated[bool, _o("--quiet", "-q", help="No progress bar.")] = False
    hosted: Annotated[bool, _o(
        "--hosted", help="Run on a Ray cluster (a Ray job; instances spread over its nodes).")] = False
    address: Annotated[Optional[str], _o(
        "--address", help="Hosted: the Ray dashboard address http://HOST:8265 (default $RAY_ADDRESS).")] = None
    detach: Annotated[bool, _o(
        "--detach", help="Hosted: submit and return (follow with `vf-sandbox runs logs ID --follow`).")] = False
    num_workers: Annotated[int, _o(
        "--num-workers", "-w", help="Worker processes (local) or at least this many Ray actors (hosted).")] = Field(1, ge=1)
