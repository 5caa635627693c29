"""Eval settings resolution: CLI flags, TOML `[[eval]]` / `[[ablation]]`
configs, the `configs/endpoints.toml` registry and per-environment defaults
from the env package's pyproject.

Precedence (most specific first):
- with a TOML config (CLI flags ignored): [[eval]] entry > TOML top-level >
  env pyproject `[tool.verifiers.eval]` > built-in defaults;
- CLI only: CLI flags > env pyproject > built-in defaults.

Every bad input raises `ConfigError` with a message naming the file, line,
key or variable concerned.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from sandboxes.errors import ConfigError
from sandboxes.registry import DEFAULT_BACKEND, backend_names
from sandboxes.retry import RetryPolicy
from sandboxes.settings import ProcessSettings
from sandboxes.settings import current as current_settings
from sandboxes.spec import ISOLATIONS, Isolation

from envs import clients as _clients
from envs.clients.config import ClientConfig, EndpointClientConfig
from runner import options as _options
from runner.options import Opt

MAX_TIMEOUT_MINUTES = 1440.0
DEFAULT_HEADER_FROM_STATE = {"X-Session-ID": "example_id"}
CLIENT_TYPES = tuple(_clients.CLIENT_TYPES)  # the implemented ones

ENDPOINT_KEYS = frozenset({"endpoint_id", "model", "url", "key", "api_client_type", "type", "headers", "extra_headers",
                           "api_base_url", "api_key_var"})
ENDPOINT_LONG_NAMES = {"api_base_url": "url", "api_key_var": "key"}
"""The reference's long field names of an endpoint (ClientConfig's), taken beside the short ones."""

RENDERER_KEYS = ("renderer_model_name", "renderer_config", "preserve_all_thinking",
                 "preserve_thinking_between_tool_calls")
"""ClientConfig settings of api_client_type "renderer" (refused with any other client type)."""


# client settings that change what a rollout's model sees or returns (the endpoint, keys,
# headers and connection limits may change between a run and its resume)
CLIENT_RESULT_FIELDS = ("client_type", *RENDERER_KEYS)


class RetryRule(BaseModel):
    """One rule of the run's rollout retries (like the reference's RetryConfig include
    list): a rollout that ended in an error is run again (a fresh state and sandbox, after
    the run's backoff: retry_initial_delay doubling up to retry_max_delay, at least a
    server's Retry-After) when every condition the rule gives holds, at most `max_retries`
    times (default: the run's --max-retries). Attempts are recorded in the row (`attempts`)."""

    model_config = {"extra": "forbid"}

    kinds: list[str] = Field(default_factory=list, description='Error verdict kinds: "model", "sandbox", "env".')
    statuses: list[int | str] = Field(default_factory=list, description='HTTP statuses of model errors: 429, 503, '
                                      'or "5xx".')
    pattern: str | None = Field(None, description="A regular expression searched in the error text (Type: message).")
    max_retries: int | None = Field(None, ge=0, description="Cap of retries under this rule.")

    def matches(self, exc: BaseException) -> bool:
        from envs.errors import error_text, error_record
        from envs.outputs import _http_status, error_verdict

        if self.kinds and error_verdict(exc) not in self.kinds:
            return False
        if self.statuses:
            status = _http_status(exc)
            if status is None or not any(status == s or (isinstance(s, str) and s.lower() == f"{status // 100}xx")
                                         for s in self.statuses):
                return False
        return not self.pattern or re.search(self.pattern, error_text(error_record(exc))) is not None


def retry_predicate(rules: list[RetryRule], max_retries: int):
    """`retry_if(exc, attempt)` of the run's rules: the first rule matching `exc` decides,
    within its own cap; None without rules (the default: infrastructure and transient
    model errors are retried)."""
    if not rules:
        return None

    def retry_if(exc: BaseException, attempt: int = 1) -> bool:
        for rule in rules:
            if rule.matches(exc):
                cap = max_retries if rule.max_retries is None else rule.max_retries
                return attempt <= cap
        return False

    return retry_if


class ClientSettings(BaseModel):
    """Settings of the model client and sampling that are not fields of the run definition
    themselves: they resolve into `EvalConfig.client_config` (with the endpoint registry's
    entry) and `EvalConfig.sampling_args`."""

    endpoints_path: Annotated[str, Opt("--endpoints-path", "-e", result=False,
                                       help="TOML endpoints registry \\[default: ./configs/endpoints.toml]")] = \
        "./configs/endpoints.toml"
    api_base_url: Annotated[str, Opt("--api-base-url", "-b", result=False,
                                     help="API base URL \\[default: https://api.pinference.ai/api/v1]")] = \
        "https://api.pinference.ai/api/v1"
    api_key_var: Annotated[str, Opt("--api-key-var", "-k", result=False,
                                    help="Environment variable holding the API key \\[default: PRIME_API_KEY]")] = \
        "PRIME_API_KEY"
    api_client_type: Annotated[str, Opt(
        "--api-client-type",
        help="openai_chat_completions | openai_completions | openai_responses | openai_chat_completions_token | "
             "nemorl_chat_completions | renderer (its settings: eval TOML) | anthropic_messages")] = \
        "openai_chat_completions"
    headers: Annotated[dict[str, str] | None, Opt(result=False, help="Extra HTTP headers (a table)")] = None
    header: Annotated[list[str] | None, Opt("--header", result=False,
                                            help="Extra HTTP header 'Name: Value' (repeatable)")] = None
    headers_from_state: Annotated[dict[str, str] | None, Opt(result=False, help="Per-request headers taken from the rollout state (header name = state key)")] = None
    header_from_state: Annotated[list[str] | None, Opt(
        "--header-from-state", result=False,
        help="Per-request header 'Name: state_key' (repeatable) \\[default: X-Session-ID: example_id]")] = None
    max_tokens: Annotated[int | None, Opt("--max-tokens", "-t", help="Maximum tokens to generate")] = None
    temperature: Annotated[float | None, Opt("--temperature", "-T", help="Sampling temperature")] = None
    client_max_retries: Annotated[int, Opt(
        "--client-max-retries", result=False, run_control=True,
        help="The model API client's own quick retries of one request (SDK max_retries), each logged "
             "\\[default: 2]")] = 2
    renderer_model_name: Annotated[str | None, Opt(help="api_client_type renderer: the tokenizer's Hugging Face name (default: the model)")] = None
    renderer_config: Annotated[Any, Opt(help="api_client_type renderer: the renderer's settings")] = None
    preserve_all_thinking: Annotated[bool | None, Opt(help="api_client_type renderer: keep every turn's thinking")] = None
    preserve_thinking_between_tool_calls: Annotated[bool | None, Opt(help="api_client_type renderer: keep thinking between tool calls")] = None
    env: Annotated[dict[str, Any] | None, Opt(help="v1 envs: [env.taskset] / [env.harness] tables (env_args.config)")] = None


class ConsoleOptions(BaseModel):
    """Options of the `vf-sandbox eval` command that are not part of the run definition
    (the display, how a run starts, hosted secrets); never recorded."""

    fullscreen: Annotated[bool, Opt("--fullscreen", "-f", toml=False, result=False, run_control=True,
                                    help="Use the alternate screen for the live display")] = False
    disable_tui: Annotated[bool, Opt("--disable-tui", "-d", toml=False, result=False, run_control=True,
                                     help="Plain logs instead of the live display")] = False
    abbreviated_summary: Annotated[bool, Opt("--abbreviated-summary", "-A", result=False, run_control=True,
                                             help="Summary without sample rollouts")] = False
    from_run: Annotated[str | None, Opt(
        "--from-run", toml=False, result=False, run_control=True,
        help="Start a NEW run with the definition of a recorded run: a run id or a results directory (explicit "
             "flags override it; to continue that run use --resume ID)")] = None
    follow: Annotated[bool, Opt("--follow", toml=False, result=False, run_control=True,
                                help="Hosted: stream the run's logs until it ends and exit with its status")] = False
    poll_interval: Annotated[float, Opt("--poll-interval", toml=False, result=False, run_control=True, cli_default=2.0,
                                        help="Hosted: seconds between status/log polls with --follow")] = 2.0
    custom_secrets: Annotated[str | None, Opt(
        "--custom-secrets", toml=False, result=False, run_control=True,
        help="Hosted: JSON object of secrets injected as environment variables of the run (never recorded)")] = None


class EvalConfig(BaseModel):
    """One fully resolved evaluation (no secrets: keys are variable names). The fields
    carrying an `Opt` marker are the run's settings: their flags, TOML keys and defaults
    are derived from these declarations (runner.options; docs/configuration.md)."""

    env_id: str
    name: Annotated[str | None, Opt("--eval-name", dest="eval_name", result=False, run_control=True,
                                    help="Name recorded for this run in the run registry")] = None
    env_args: Annotated[dict[str, Any], Opt("--env-args", "-a", cli_type=str,
                                            help="JSON object passed to load_environment() \\[default: {}]")] = Field(default_factory=dict)
    env_dir_path: Annotated[str, Opt("--env-dir-path", "-p",
                                     help="Base path of local environments \\[default: ./environments]")] = "./environments"
    endpoint_id: Annotated[str | None, Opt(result=False, help="An alias of the endpoint registry (-e) to use; set from -m when the model names one")] = None
    model: Annotated[str, Opt("--model", "-m", help="Model name or endpoint alias \\[default: openai/gpt-4.1-mini]")] = \
        "openai/gpt-4.1-mini"
    client_config: ClientConfig
    sampling_args: Annotated[dict[str, Any], Opt("--sampling-args", "-S", cli_type=str,
                                                 help="JSON object of extra sampling parameters")] = Field(default_factory=dict)
    num_examples: Annotated[int, Opt("--num-examples", "-n", result=False,
                                     help="Number of dataset examples \\[default: 5]")] = 5
    rollouts_per_example: Annotated[int, Opt("--rollouts-per-example", "-r",
                                             help="Rollouts per example \\[default: 3]")] = 3
    max_concurrent: Annotated[int, Opt("--max-concurrent", "-c", result=False, run_control=True,
                                       help="Maximum concurrent rollouts \\[default: 32]")] = 32
    max_concurrent_generation: Annotated[int | None, Opt("--max-concurrent-generation", result=False,
                                                         help="Concurrent generation requests \\[default: same as -c]")] = None
    max_concurrent_scoring: Annotated[int | None, Opt("--max-concurrent-scoring", result=False,
                                                      help="Concurrent scoring requests \\[default: same as -c]")] = None
    independent_scoring: Annotated[bool, Opt("--independent-scoring", "-i",
                                             help="Score each rollout individually")] = False
    no_interleave_scoring: Annotated[bool, Opt("--no-interleave-scoring", "-N", result=False,
                                               help="Score after generation instead of per group")] = False
    extra_env_kwargs: Annotated[dict[str, Any], Opt(
        "--extra-env-kwargs", "-x", cli_type=list[str],
        help="Environment settings: a JSON object or key=value[,key=value] (e.g. isolation=gvisor); repeatable, "
             "merged \\[default: {}]")] = Field(default_factory=dict)
    max_retries: Annotated[int, Opt("--max-retries", result=False, run_control=True,
                                    help="Retries of a rollout after an infrastructure or transient model-API error, "
                                         "each logged \\[default: 0]")] = 0
    verbose: Annotated[bool, Opt("--verbose", "-v", result=False, run_control=True, help="Debug logging")] = False
    state_columns: Annotated[list[str], Opt("--state-columns", "-C", cli_type=str,
                                            help="Extra state columns to save (comma-separated)")] = Field(default_factory=list)
    save_results: Annotated[bool, Opt("--save-results", "-s", result=False, run_control=True,
                                      help="Save results to disk")] = False
    output_dir: Annotated[str | None, Opt("--output-dir", "-o", result=False, run_control=True,
                                          help="Base output directory \\[default: ./outputs]")] = None
    resume: Annotated[bool, Opt(toml=False, result=False, help="Set by --resume: continue a run")] = False
    resume_path: Annotated[str | None, Opt(
        "--resume", "-R", dest="resume", toml=False, result=False, run_control=True,
        help="Continue a run: its run id or results directory (alone, it needs no other flag), or, with no value, "
             "the newest incomplete run of this definition in the run registry; runs exactly its errored and "
             "missing rollouts")] = Field(None, description="--resume REF: a run id (or unique prefix) or a results "
                                          "directory; None with resume=True: the newest incomplete run of this "
                                          "definition in the run registry.")
    extend: Annotated[bool, Opt("--extend", toml=False, result=False, run_control=True,
                                help="With --resume: allow a larger -n to add examples to a completed run")] = Field(
        False, description="--extend: a resume may add examples (a larger -n) to a completed run.")
    save_to_hf_hub: Annotated[bool, Opt("--save-to-hf-hub", "-H", result=False,
                                        help="Push results to the Hugging Face Hub")] = False
    hf_hub_dataset_name: Annotated[str | None, Opt("--hf-hub-dataset-name", "-D", result=False,
                                                   help="Dataset name on the HF Hub")] = None
    timeout_minutes: Annotated[float, Opt("--timeout-minutes", result=False, run_control=True,
                                          help="Stop cleanly after this many minutes \\[default: 120, max 1440]")] = Field(
        120.0, gt=0, le=MAX_TIMEOUT_MINUTES)
    heartbeat_url: Annotated[str | None, Opt("--heartbeat-url", result=False,
                                             help="URL to GET every 30 s while the eval runs (uptime monitoring)")] = None
    shuffle: Annotated[bool, Opt(help="Shuffle the dataset before taking -n examples")] = False
    shuffle_seed: Annotated[int | None, Opt(help="Seed of the shuffle")] = None
    # -- beyond the reference: where sandboxes run and how the run is driven
    backend: Annotated[str, Opt("--backend", result=False, run_control=True,
                                help="Sandbox backend of sandbox-backed envs: docker | local | kubernetes | prime "
                                     "\\[default: docker]")] = DEFAULT_BACKEND
    backend_options: Annotated[dict[str, Any], Opt("--backend-options", cli_type=str, result=False, run_control=True,
                                                   help="JSON object passed to the sandbox backend's constructor")] = \
        Field(default_factory=dict)
    num_workers: Annotated[int, Opt("--num-workers", "-w", cli_type=str, cli_default="auto", result=False,
                                    run_control=True, help="Worker processes sharing the run (auto = 1)")] = Field(1, ge=1)
    retry_initial_delay: Annotated[float, Opt(result=False, help="Seconds before the first retry (doubling)")] = Field(0.5, ge=0)
    retry_max_delay: Annotated[float, Opt(result=False, help="Longest wait between retries, in seconds")] = Field(30.0, ge=0)
    # -- honest results (one place for local, -w N and hosted runs)
    max_error_rate: Annotated[float, Opt(
        "--max-error-rate", result=False, run_control=True,
        help="Share of rollouts (0..1) that may end in a model / sandbox / env error and the run still be completed "
             "(exit 0) \\[default: 0]")] = Field(0.0, ge=0, le=1, description="--max-error-rate: share of rollouts "
                                                 "that may end in a model / sandbox / env error and the run still be "
                                                 "`completed` (exit 0).")
    rollout_timeout: Annotated[float | None, Opt(
        "--rollout-timeout", result=False, run_control=True,
        help="Seconds a whole rollout may take (model calls, tool calls, env code; its scoring as much again): "
             "then it ends, its sandbox deleted: a model error when it waited on the model, else its result "
             "(scored, sandbox_timeout) \\[default: none; a model request gives up after 600 s]")] = Field(
        None, gt=0, description="--rollout-timeout: seconds a whole rollout may take (then a model error when it "
        "waited on the model, a sandbox error in setup, else the rollout's result: scored, sandbox_timeout 1, stop "
        "rollout_timeout); None: no bound, a model request gives up after 600 s (runner.setup).")
    endpoint_down_after: Annotated[int, Opt(result=False)] = Field(
        8, ge=0, description="Consecutive rollouts failing to reach the model endpoint after which nothing new "
        "starts and the run ends `incomplete` (0: never).")
    retry_rules: Annotated[list[RetryRule], Opt(result=False)] = Field(
        default_factory=list, description="Which errors retry a rollout (TOML [[retry_rules]]); empty: "
        "infrastructure and transient model errors (connection, 429, 5xx). --max-retries is the overall attempt "
        "budget.")
    isolation: Annotated[Isolation | None, Opt()] = Field(
        None, description='Kernel boundary of every sandbox of the run: "runc" or "gvisor"; None = what the '
        'environment asks for (runc unless it says gvisor).')

    kind: str = Field("eval", description="The run's kind in the run registry (eval, swe-debug).")
    junit_xml: Annotated[str | None, Opt(
        "--junit-xml", result=False, run_control=True,
        help="Also write the results as a JUnit XML report (a test case per rollout) for CI")] = Field(
        None, description="Also write the results as a JUnit XML report here.")
    # -- hosted runs (a Ray job on a cluster; see hosted.submit)
    hosted: Annotated[bool, Opt("--hosted", result=False, run_control=True,
                                help="Run as a Ray job on a cluster (see --address); needs vf-sandbox[ray]")] = Field(
        False, description="Run as a Ray job on the cluster at `address`.")
    address: Annotated[str | None, Opt("--address", result=False, run_control=True,
                                       help="Hosted: the Ray dashboard address http://HOST:8265 \\[default: "
                                            "$RAY_ADDRESS]")] = Field(
        None, description="The Ray cluster's dashboard address (http://HOST:8265).")
    allow_sandbox_access: Annotated[bool, Opt("--allow-sandbox-access", result=False, run_control=True,
                                              help="Hosted: allow the run to create sandboxes")] = Field(
        False, description="Hosted: the run may create sandboxes.")
    allow_instances_access: Annotated[bool, Opt(
        "--allow-instances-access", result=False, run_control=True,
        help="Hosted: allow the run to create instances/pods (kubernetes, prime backends)")] = Field(
        False, description="Hosted: the run may create instances/pods (kubernetes, prime).")
    custom_secret_names: list[str] = Field(default_factory=list,
                                           description="Hosted: names of the variables injected from --custom-secrets "
                                                       "(the values are never recorded).")
    run_id: str | None = Field(None, description="The run's id in the run registry (and its results directory's "
                               "name) when the caller chose it (a hosted job: the id its submitter recorded); None: a "
                               "fresh id when the run starts. Never carried over by --from-run.")
    sandbox_run_id: str | None = Field(None, description="The label (`vf-sandbox.run-id`) every sandbox of the run "
                                       "carries, in this process, its -w worker processes and its Ray actors, so "
                                       "`runs stop` and the reaper find them (a hosted job: `vf-<run id>`); None: "
                                       "this process's own label (`sandboxes.labels.run_id()`), filled in when the "
                                       "run starts. Never recorded, never carried over.")
    runs_db: str | None = Field(None, description="The run registry file this run is recorded in; None: the "
                                "default registry (`runs.registry.db_path()`). A hosted job: its own file beside "
                                "its results. Never recorded, never carried over.")
    settings: ProcessSettings | None = Field(None, description="What the process environment said where the run was "
                                             "started (`sandboxes.settings.ProcessSettings`, read once by the "
                                             "command's entry; the run's ids are the fields above): the run, its -w "
                                             "workers and Ray actors use these, whatever their own environment says. "
                                             "The registry credentials are never serialised with them (-w workers "
                                             "get the runner's beside it). Never recorded, never carried over; None: the running "
                                             "settings, filled in when the run starts.")

    model_config = {"extra": "forbid"}

    def process_settings(self) -> ProcessSettings:
        """The settings this run's code runs with (`sandboxes.settings.use`): the
        definition's (None: the running ones) with the run's own ids."""
        base = self.settings if self.settings is not None else current_settings()
        return base.model_copy(update={"sandbox_run_id": self.sandbox_run_id or base.sandbox_run_id,
                                       "runs_db": self.runs_db or base.runs_db, "run_id": self.run_id})

    def retry_policy(self) -> RetryPolicy:
        """The run's one retry policy: `max_retries` extra tries after the first."""
        return RetryPolicy.from_max_retries(self.max_retries, initial_delay=self.retry_initial_delay,
                                            max_delay=self.retry_max_delay)

    def rollout_retries(self) -> int:
        """Extra tries a rollout may get: --max-retries, or more where a retry rule allows more."""
        caps = [r.max_retries for r in self.retry_rules if r.max_retries is not None]
        return max([self.max_retries, *caps])

    def definition_diff(self, other: "EvalConfig") -> list[str]:
        """What differs between two definitions in ways that change a rollout's result
        (run control such as concurrency, output and resume settings is ignored)."""
        ignore = {d.name for d in _options.declared(EvalConfig) if not d.opt.result} | NOT_COMPARED
        mine, theirs = self.public_args(), other.public_args()
        for args in (mine, theirs):  # endpoints may move between attempts; what the client renders may not
            cc = args.get("client_config") or {}
            args.update({f"client_config.{k}": cc.get(k) for k in CLIENT_RESULT_FIELDS})
        return [f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in sorted(set(mine) | set(theirs))
                if k not in ignore and mine.get(k) != theirs.get(k)]

    def public_args(self) -> dict[str, Any]:
        """The settings as a JSON-able dict for the run registry: API keys appear
        only as variable names and header values are redacted (they may carry tokens)."""
        data = self.model_dump(mode="json", exclude=set(PROCESS_FIELDS))
        cc = data["client_config"]
        cc["extra_headers"] = {k: REDACTED for k in cc.get("extra_headers", {})}
        for ep in cc.get("endpoint_configs", []):
            ep["extra_headers"] = {k: REDACTED for k in ep.get("extra_headers", {})}
        data["backend_options"] = {k: (REDACTED if _SECRET_KEY.search(k) else v) for k, v in self.backend_options.items()}
        data["env_args"] = redact_secrets(data["env_args"])  # e.g. a sandbox env var holding a token
        data["extra_env_kwargs"] = redact_secrets(data["extra_env_kwargs"])
        return data


PROCESS_FIELDS = frozenset({"sandbox_run_id", "runs_db", "settings"})
"""Fields of the run definition that say where this process runs it (its sandboxes' label, its
registry file, the process settings): handed down to workers and actors, never recorded
(`public_args` leaves them out), compared (`definition_diff`) or carried over (--from-run)."""
RUN_IDS = {"run_id": None, "sandbox_run_id": None, "runs_db": None}
"""The ids a definition keeps in its own fields, not in its `settings`."""
SETTING_MODELS = (EvalConfig, ClientSettings, ConsoleOptions)
"""Where the settings are declared: every flag of `vf-sandbox eval` and every TOML key."""
BUILTIN_DEFAULTS: dict[str, Any] = _options.defaults(EvalConfig, ClientSettings)
SETTING_KEYS = _options.toml_keys(*SETTING_MODELS)
"""Keys accepted in a TOML eval config (top level and inside [[eval]] / [[ablation]])."""
EVAL_KEYS = SETTING_KEYS | {"env_id", "id", "args"}
NOT_COMPARED = frozenset({"client_config", "custom_secret_names", "run_id"}) | PROCESS_FIELDS
"""Fields of the run definition that resume's definition diff leaves to `CLIENT_RESULT_FIELDS`
(the endpoint may move) or that only name secrets; every other field is compared unless its
`Opt` says `result=False`."""


REFERENCE_HEADER = """# Configuration reference

[← README](../README.md) · [the run definition](run-definition.md)

Generated from the declarations in `runner/config.py` (`EvalConfig`, `ClientSettings`,
`ConsoleOptions`: each setting is one pydantic field with an `Opt` marker) by
`runner.config.configuration_reference()`; `tests/test_setting_surfaces.py` keeps this
page current. Every setting with a TOML mark is a key of a TOML eval config (top level,
`[[eval]]`, `[[ablation]]`; an unknown key is refused naming the valid ones); with a TOML
config or a recorded run (`--from-run`, `--resume RUN`) only the run-control flags apply
(`-c -w -o -s -R --backend --max-retries --timeout-minutes ...`). "resume compares": a
different value makes `--resume` refuse to continue the run. `-x key=value` settings are
each environment's own (`Environment.settable_kwargs()`, see [the run definition](run-definition.md)).
"""


def configuration_reference() -> str:
    """The text of docs/configuration.md, rendered from the declared settings."""
    return REFERENCE_HEADER + "\n" + _options.reference_markdown(
        ("The run definition (EvalConfig)", EvalConfig),
        ("Model client and sampling (resolved into client_config and sampling_args)", ClientSettings),
        ("Console and launch (not recorded)", ConsoleOptions))

# --------------------------------------------------------------------------- parsing helpers


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    """Parse a `-a/-x/-S` JSON object, or raise ConfigError naming the flag."""
    if text is None or text == "":
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag}: invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): {text!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: expected a JSON object like '{{\"key\": 1}}', got {type(value).__name__}: {text!r}")
    return value


def parse_kwargs(text: str | None, flag: str) -> dict[str, Any]:
    """`-x`: a JSON object, or the shorthand `key=value[,key=value...]` (each value read
    as JSON when it parses, e.g. `n=3`, `flag=true`, else taken as a string: `isolation=gvisor`)."""
    if text is None or not text.strip() or text.lstrip().startswith("{"):
        return parse_json_object(text, flag)
    out: dict[str, Any] = {}
    for pair in re.split(r",(?=\s*[A-Za-z_][A-Za-z0-9_]*=)", text):
        key, sep, raw = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise ConfigError(f"{flag}: expected a JSON object or key=value pairs, got {text!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw.strip()
    return out


def parse_kwargs_list(texts: list[str] | str | None, flag: str) -> dict[str, Any]:
    """A repeatable `-x`: each occurrence parsed by `parse_kwargs`, merged in order; a key
    given twice with different values is a ConfigError (never silently the last one)."""
    if texts is None or isinstance(texts, str):
        return parse_kwargs(texts, flag)
    out: dict[str, Any] = {}
    for text in texts:
        for key, value in parse_kwargs(text, flag).items():
            if key in out and out[key] != value:
                raise ConfigError(f"{flag}: {key} is given twice ({out[key]!r} and {value!r})")
            out[key] = value
    return out


def parse_header_lines(lines: list[str] | None, what: str = "--header") -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines or []:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"{what}: expected 'Name: Value', got {line!r}")
        out[name.strip()] = value.strip()
    return out


def load_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file; syntax errors name the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None


def _check_keys(table: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}")


# --------------------------------------------------------------------------- endpoints registry


class Endpoint(BaseModel):
    endpoint_id: str
    model: str
    url: str
    key: str
    api_client_type: str = "openai_chat_completions"
    headers: dict[str, str] = Field(default_factory=dict)


def load_endpoints(path: str | Path | None) -> dict[str, list[Endpoint]]:
    """endpoint_id -> replicas, from a TOML registry ({} when the file is absent)."""
    if path is None:
        return {}
    p = Path(path)
    if not p.exists():
        return {}
    data = load_toml(p)
    _check_keys(data, frozenset({"endpoint"}), f"{p}")
    rows = data.get("endpoint", [])
    if not isinstance(rows, list):
        raise ConfigError(f"{p}: 'endpoint' must be an array of tables ([[endpoint]])")
    out: dict[str, list[Endpoint]] = {}
    for i, row in enumerate(rows, 1):
        where = f"{p}: [[endpoint]] #{i}"
        _check_keys(row, ENDPOINT_KEYS, where)
        row = dict(row)
        for long_name, short in ENDPOINT_LONG_NAMES.items():
            if long_name in row:
                if short in row and row[short] != row[long_name]:
                    raise ConfigError(f"{where}: '{short}' and '{long_name}' differ ({row[short]!r} vs "
                                      f"{row[long_name]!r}): set one of them")
                row[short] = row.pop(long_name)
        missing = [k for k in ("endpoint_id", "model", "url", "key") if k not in row]
        if missing:
            raise ConfigError(f"{where}: missing required key(s) {missing}")
        if "headers" in row and "extra_headers" in row:
            raise ConfigError(f"{where}: set either 'headers' or 'extra_headers', not both")
        ctype = row.get("api_client_type", row.get("type", "openai_chat_completions"))
        if ctype not in CLIENT_TYPES:
            try:
                _clients.check_client_type(ctype)
            except ConfigError as exc:
                raise ConfigError(f"{where}: api_client_type: {exc}") from None
        headers = row.get("headers", row.get("extra_headers", {})) or {}
        out.setdefault(row["endpoint_id"], []).append(
            Endpoint(endpoint_id=row["endpoint_id"], model=row["model"], url=row["url"], key=row["key"],
                     api_client_type=ctype, headers={str(k): str(v) for k, v in headers.items()})
        )
    return out


NO_MODEL = "none"
"""The model name of runs that call no model (vf-swe-debug): never an endpoint alias."""


def endpoint_registries(path: str | Path | None) -> list[Path]:
    """The endpoint registries an alias is looked up in, in order: the one given
    (-e / endpoints_path) alone; else `configs/endpoints.toml` in the working directory
    and each of its parents, then the vf-sandbox checkout's own."""
    if path is not None:
        return [Path(path)]
    rel = Path(BUILTIN_DEFAULTS["endpoints_path"])
    here = Path.cwd()
    out = [here / rel, *(d / rel for d in here.parents)]
    checkout = Path(__file__).resolve().parents[1] / rel
    if checkout not in out:
        out.append(checkout)
    return out


def is_alias_like(model: str) -> bool:
    """A model name with no provider prefix ("local", not "openai/gpt-4.1-mini"): with no
    --api-base-url it can only mean an endpoint alias."""
    return "/" not in model and model != NO_MODEL


def unknown_endpoint_message(name: str, looked_in: list[Path], known: list[str]) -> str:
    import difflib

    shown = [str(p) + ("" if p.exists() else " (absent)") for p in looked_in[:3]]
    if len(looked_in) > 3:
        shown.append(f"... {len(looked_in) - 3} more, up to {looked_in[-1]}")
    where = looked_in[0] if len(looked_in) == 1 else BUILTIN_DEFAULTS["endpoints_path"].removeprefix("./")
    msg = f"no endpoint {name!r} in {where} (looked in: {'; '.join(shown)})"
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return msg + f"; did you mean {close[0]!r}?"
    return msg + (f"; known endpoints: {', '.join(known)}" if known else "") + (
        ". Name a registry with -e PATH, or give the model's URL with -b URL (and its key variable with -k)")


# --------------------------------------------------------------------------- env pyproject defaults


def env_defaults(env_id: str, env_dir: str | Path | None) -> dict[str, Any]:
    """`[tool.verifiers.eval]` (or `[tool.vf-sandbox.eval]`) of the env package's pyproject."""
    from envs.loader import env_package_dir

    pkg = env_package_dir(env_id, env_dir)
    if pkg is None:
        return {}
    data = load_toml(pkg / "pyproject.toml")
    tool = data.get("tool", {})
    defaults = {**(tool.get("verifiers", {}).get("eval", {})), **(tool.get("vf-sandbox", {}).get("eval", {}))}
    allowed = frozenset({"num_examples", "rollouts_per_example", "max_concurrent", "sampling_args", "max_tokens", "temperature", "env_args", "max_retries"})
    _check_keys(defaults, allowed, f"{pkg / 'pyproject.toml'}: [tool.verifiers.eval]")
    return defaults


# --------------------------------------------------------------------------- resolution


def _merge_layers(*layers: dict[str, Any]) -> dict[str, Any]:
    """First layer that sets a key wins (layers given most specific first)."""
    out: dict[str, Any] = {}
    for layer in reversed(layers):
        for key, value in layer.items():
            if value is not None:
                out[key] = value
    return out


def build_eval_config(settings: dict[str, Any], endpoints_cache: dict[str, dict[str, list[Endpoint]]] | None = None) -> EvalConfig:
    """Resolve one eval from merged raw settings (built-in defaults applied here): the
    endpoint and client, then the declared fields of `EvalConfig` taken as given."""
    env_id = settings.get("env_id")
    if not env_id:
        raise ConfigError("an eval needs an env_id")
    s = _merge_layers(settings, BUILTIN_DEFAULTS)
    endpoint_id, model, replicas = _resolve_endpoint(settings, s, endpoints_cache)
    client_config = _client_config(settings, s, replicas)
    _check_run_settings(s)
    resolved = {
        "env_id": env_id, "kind": s.get("kind", "eval"), "endpoint_id": endpoint_id, "model": model,
        "client_config": client_config, "sampling_args": _sampling_args(s), "state_columns": _state_columns(s),
        "extra_env_kwargs": {k: v for k, v in (s.get("extra_env_kwargs") or {}).items() if k != "isolation"},
        "isolation": _isolation(s), "address": _address(s),
        "custom_secret_names": sorted(s.get("custom_secret_names") or []),
    }
    values: dict[str, Any] = {}
    for d in _options.declared(EvalConfig):
        value = s.get(d.name)
        if d.annotation is bool:
            values[d.name] = bool(value or False)
        elif value is not None:
            values[d.name] = float(value) if _options.without_none(d.annotation) is float else value
    return EvalConfig(**{**values, **resolved})


def _resolve_endpoint(settings: dict[str, Any], s: dict[str, Any],
                      endpoints_cache: dict[str, dict[str, list[Endpoint]]] | None) -> tuple[str | None, str, list[Endpoint]]:
    """(endpoint_id, model, the endpoint's replicas) of the eval: `-m` / endpoint_id looked up
    in the endpoint registries (a bare name with no -b must be an alias there)."""
    cache = endpoints_cache if endpoints_cache is not None else {}
    candidates = endpoint_registries(settings.get("endpoints_path"))
    for path in candidates:
        if str(path) not in cache:
            cache[str(path)] = load_endpoints(path)
    endpoint_id = settings.get("endpoint_id")
    model = s["model"]
    wanted = endpoint_id if endpoint_id is not None else model
    found = next((p for p in candidates if wanted in cache[str(p)]), None)
    if found is not None:
        replicas = cache[str(found)][wanted]
        return wanted, replicas[0].model, replicas
    if endpoint_id is not None or (not settings.get("api_base_url") and is_alias_like(model)):
        # a bare name with no -b is an endpoint alias: never send it to the default hosted endpoint
        known = sorted({k for p in candidates for k in cache[str(p)]})
        raise ConfigError(unknown_endpoint_message(wanted, candidates, known))
    return endpoint_id, model, []


def _client_config(settings: dict[str, Any], s: dict[str, Any], replicas: list[Endpoint]) -> ClientConfig:
    """The model client of the eval: the endpoint's entry under the explicit settings."""
    client_type = settings.get("api_client_type")
    if replicas:
        client_type = client_type or replicas[0].api_client_type
        base_url = settings.get("api_base_url") or replicas[0].url
        key_var = settings.get("api_key_var") or replicas[0].key
    else:
        base_url, key_var = s["api_base_url"], s["api_key_var"]
    client_type = client_type or BUILTIN_DEFAULTS["api_client_type"]
    if client_type not in CLIENT_TYPES:
        try:
            _clients.check_client_type(client_type)
        except ConfigError as exc:
            raise ConfigError(f"api_client_type: {exc}") from None
    headers, from_state = _headers(s, replicas)
    client_retries = s.get("client_max_retries", BUILTIN_DEFAULTS["client_max_retries"])
    if isinstance(client_retries, bool) or not isinstance(client_retries, int) or client_retries < 0:
        raise ConfigError(f"client_max_retries must be an integer >= 0, got {client_retries!r}")
    endpoint_configs: list[EndpointClientConfig] = []
    if len(replicas) > 1 and not settings.get("api_base_url"):
        endpoint_configs = [
            EndpointClientConfig(api_key_var=settings.get("api_key_var") or r.key, api_base_url=r.url,
                                 extra_headers=r.headers, max_retries=client_retries)
            for r in replicas
        ]
    renderer = {k: s[k] for k in RENDERER_KEYS if s.get(k) is not None}
    if renderer and client_type != "renderer":
        raise ConfigError(f"{', '.join(renderer)}: settings of api_client_type 'renderer', not {client_type!r}")
    try:
        return ClientConfig(client_type=client_type, api_key_var=key_var, api_base_url=base_url,
                            endpoint_configs=endpoint_configs, extra_headers=headers,
                            extra_headers_from_state=from_state, max_retries=client_retries, **renderer)
    except ValueError as exc:
        raise ConfigError(f"client settings: {exc}") from None


def _headers(s: dict[str, Any], replicas: list[Endpoint]) -> tuple[dict[str, str], dict[str, str]]:
    """(extra headers, headers from state): the endpoint's, then `headers` / `header` lines."""
    headers: dict[str, str] = dict(replicas[0].headers) if replicas else {}
    headers.update({str(k): str(v) for k, v in (s.get("headers") or {}).items()})
    headers.update(parse_header_lines(s.get("header"), "header"))
    from_state = dict(DEFAULT_HEADER_FROM_STATE)
    from_state.update({str(k): str(v) for k, v in (s.get("headers_from_state") or {}).items()})
    from_state.update(parse_header_lines(s.get("header_from_state"), "header_from_state"))
    return headers, from_state


def _sampling_args(s: dict[str, Any]) -> dict[str, Any]:
    sampling = dict(s.get("sampling_args") or {})
    if s.get("max_tokens") is not None:
        sampling["max_tokens"] = s["max_tokens"]
    if s.get("temperature") is not None:
        sampling["temperature"] = s["temperature"]
    return sampling


def _state_columns(s: dict[str, Any]) -> list[str]:
    state_columns = s.get("state_columns") or []
    if isinstance(state_columns, str):
        state_columns = [c.strip() for c in state_columns.split(",") if c.strip()]
    return list(state_columns)


def _check_run_settings(s: dict[str, Any]) -> None:
    """Checks of the run's numbers and choices, with messages naming the setting (and flag)."""
    for key in ("num_examples", "rollouts_per_example", "max_concurrent"):
        value = s[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
    if s["num_examples"] == 0 or s["num_examples"] < -1:
        raise ConfigError(f"num_examples (-n) must be a positive number of examples, or -1 for the whole dataset; "
                          f"got {s['num_examples']}")
    if s["rollouts_per_example"] < 1:
        raise ConfigError("rollouts_per_example must be >= 1")
    if s["max_concurrent"] == 0:
        raise ConfigError("max_concurrent must be positive (or -1 for unlimited)")
    if s["backend"] not in backend_names():
        raise ConfigError(f"unknown sandbox backend {s['backend']!r}; known: {', '.join(backend_names())}")
    if not isinstance(s.get("backend_options") or {}, dict):
        raise ConfigError("backend_options must be a table / JSON object")
    timeout = s["timeout_minutes"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_MINUTES:
        raise ConfigError(f"timeout_minutes must be a number in (0, {MAX_TIMEOUT_MINUTES:g}], got {timeout!r}")
    workers = s["num_workers"]
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"num_workers must be a positive integer, got {workers!r}")
    if workers > 1 and s.get("no_interleave_scoring"):
        raise ConfigError("--no-interleave-scoring/-N needs every rollout in one process; it cannot be combined with -w > 1")
    if s.get("hosted") and s.get("no_interleave_scoring"):
        raise ConfigError("--no-interleave-scoring/-N needs every rollout in one process; it cannot be combined with --hosted")
    max_retries = s.get("max_retries", 0)
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ConfigError(f"max_retries must be an integer >= 0, got {max_retries!r}")


def _address(s: dict[str, Any]) -> str | None:
    """A hosted run's Ray address (the setting, else $RAY_ADDRESS), normalised."""
    if not s.get("hosted"):
        return s.get("address")
    return normalise_address(s.get("address") or os.environ.get("RAY_ADDRESS"))


def normalise_address(address: str | None) -> str:
    """The Ray Jobs API address of a hosted run: `http(s)://HOST:PORT` (the dashboard,
    8265 by default); a bare `HOST:PORT` gets `http://`. Raises ConfigError."""
    if not address:
        raise ConfigError("--hosted needs a Ray cluster: pass --address http://HOST:8265 (the dashboard's address), "
                          "set RAY_ADDRESS, or put address = \"...\" in the TOML config")
    address = str(address).strip().rstrip("/")
    if address.startswith("ray://"):
        raise ConfigError(f"--address {address}: give the Ray dashboard's HTTP address (http://HOST:8265), "
                          "not a Ray Client ray:// address")
    if "://" not in address:
        address = f"http://{address}"
    if not re.match(r"^https?://[^/:]+(:\d+)?$", address):
        raise ConfigError(f"--address {address!r}: expected http://HOST:PORT")
    return address


def _isolation(s: dict[str, Any]) -> str | None:
    """The run's isolation: the `isolation` setting, or `isolation` given with the env's
    settings (`-x isolation=gvisor`), which is lifted into the run definition (one place)."""
    via_kwargs = (s.get("extra_env_kwargs") or {}).get("isolation")
    value = s.get("isolation")
    if value is not None and via_kwargs is not None and value != via_kwargs:
        raise ConfigError(f"isolation is set twice: {value!r} and {via_kwargs!r} (in extra_env_kwargs / -x)")
    value = value if value is not None else via_kwargs
    if value is not None and value not in ISOLATIONS:
        raise ConfigError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {value!r}")
    return value


def _with_env_defaults(layers_specific: list[dict[str, Any]], env_id: str, env_dir: str | None) -> dict[str, Any]:
    defaults = env_defaults(env_id, env_dir or BUILTIN_DEFAULTS["env_dir_path"])
    merged = _merge_layers(*layers_specific, defaults)
    # env_args from pyproject defaults merge under the explicit ones
    if "env_args" in defaults:
        merged["env_args"] = {**defaults["env_args"], **_merge_layers(*layers_specific).get("env_args", {})}
    return merged


def configs_from_cli(env_ids: list[str], cli: dict[str, Any]) -> list[EvalConfig]:
    """CLI only: CLI flags > env pyproject > built-in defaults."""
    cache: dict[str, dict[str, list[Endpoint]]] = {}
    out = []
    for env_id in env_ids:
        merged = _with_env_defaults([{k: v for k, v in cli.items() if v is not None}], env_id, cli.get("env_dir_path"))
        merged["env_id"] = env_id
        out.append(build_eval_config(merged, cache))
    return out


V1_ENV_SECTIONS = ("taskset", "harness")


def _v1_env_table(table: dict[str, Any], where: str) -> dict[str, Any]:
    """`[env.taskset]` / `[env.harness]` (v1 envs) become env_args["config"], which the
    loader validates against the env's EnvConfig (unknown fields named there)."""
    env = table.pop("env", None)
    if env is None:
        return table
    if not isinstance(env, dict) or set(env) - set(V1_ENV_SECTIONS):
        raise ConfigError(f"{where}: [env] takes only the sections {list(V1_ENV_SECTIONS)}, got {sorted(env) if isinstance(env, dict) else env!r}")
    for name, section in env.items():
        if not isinstance(section, dict):
            raise ConfigError(f"{where}: env.{name} must be a table")
    args = dict(table.get("env_args") or {})
    config = dict(args.get("config") or {})
    for name, section in env.items():
        config[name] = {**(config.get(name) or {}), **section}
    args["config"] = config
    table["env_args"] = args
    return table


def _merge_env_args(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; a v1 `config` table merges per section (taskset / harness)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "config" and isinstance(value, dict) and isinstance(out.get("config"), dict):
                out["config"] = {n: {**(out["config"].get(n) or {}), **(value.get(n) or {})}
                                 for n in {*out["config"], *value}}
            else:
                out[key] = value
    return out


def _normalise_eval_table(table: dict[str, Any], where: str) -> dict[str, Any]:
    table = dict(table)
    if "id" in table:
        table.setdefault("env_id", table.pop("id"))
    if "args" in table:
        if "env_args" in table:
            raise ConfigError(f"{where}: set either 'args' or 'env_args', not both")
        table["env_args"] = table.pop("args")
    table = _v1_env_table(table, where)
    for key in ("env_args", "extra_env_kwargs", "sampling_args", "headers", "headers_from_state", "backend_options"):
        if key in table and not isinstance(table[key], dict):
            raise ConfigError(f"{where}: {key} must be a table, got {type(table[key]).__name__}")
    return table


def expand_ablation(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Cartesian product of an [[ablation]] block's `sweep` (and `sweep.env_args`)."""
    block = dict(block)
    sweep = block.pop("sweep", {}) or {}
    if not isinstance(sweep, dict):
        raise ConfigError(f"{where}: sweep must be a table")
    _check_keys(block, EVAL_KEYS, where)
    _check_keys(sweep, EVAL_KEYS, f"{where}.sweep")
    fixed = _normalise_eval_table(block, where)
    sweep_env_args = sweep.pop("env_args", {}) or {}
    if not isinstance(sweep_env_args, dict):
        raise ConfigError(f"{where}.sweep.env_args must be a table of lists")
    clash = set(sweep_env_args) & set(fixed.get("env_args", {}))
    if clash:
        raise ConfigError(f"{where}: env_args key(s) {sorted(clash)} are both fixed and swept")
    if "env_id" in sweep:
        fixed.pop("env_id", None)
    axes: list[tuple[str, str, list[Any]]] = []
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.sweep.{key} must be a non-empty list")
        axes.append(("top", key, values))
    for key, values in sweep_env_args.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.sweep.env_args.{key} must be a non-empty list")
        axes.append(("env_args", key, values))
    if "env_id" not in fixed and "env_id" not in sweep:
        raise ConfigError(f"{where}: needs an env_id (fixed or swept)")
    out = []
    for combo in itertools.product(*(values for _, _, values in axes)) if axes else [()]:
        entry = dict(fixed)
        entry["env_args"] = dict(fixed.get("env_args", {}))
        for (kind, key, _), value in zip(axes, combo):
            if kind == "env_args":
                entry["env_args"][key] = value
            else:
                entry[key] = value
        out.append(entry)
    return out


def configs_from_toml(path: str | Path, overrides: dict[str, Any] | None = None) -> list[EvalConfig]:
    """TOML config: [[eval]] entry > top level > env pyproject > built-in.
    `overrides` carries the few run-control flags that still apply (resume, output_dir)."""
    p = Path(path)
    data = load_toml(p)
    top = {k: v for k, v in data.items() if k not in ("eval", "ablation")}
    _check_keys(top, SETTING_KEYS, f"{p}: top level")
    top = _v1_env_table(top, f"{p}: top level")
    evals = data.get("eval", [])
    ablations = data.get("ablation", [])
    if not isinstance(evals, list) or not isinstance(ablations, list):
        raise ConfigError(f"{p}: use [[eval]] and [[ablation]] (arrays of tables)")
    entries: list[tuple[str, dict[str, Any]]] = []
    for i, table in enumerate(evals, 1):
        where = f"{p}: [[eval]] #{i}"
        _check_keys(table, EVAL_KEYS, where)
        entry = _normalise_eval_table(table, where)
        if not entry.get("env_id"):
            raise ConfigError(f"{where}: missing required key 'env_id'")
        entries.append((where, entry))
    for i, block in enumerate(ablations, 1):
        where = f"{p}: [[ablation]] #{i}"
        entries.extend((where, e) for e in expand_ablation(block, where))
    if not entries:
        raise ConfigError(f"{p}: no [[eval]] or [[ablation]] section")
    top.setdefault("save_results", True)
    cache: dict[str, dict[str, list[Endpoint]]] = {}
    out = []
    for where, entry in entries:
        try:
            merged = _with_env_defaults([entry, top], entry["env_id"], entry.get("env_dir_path") or top.get("env_dir_path"))
            if "env_args" in top or "env_args" in entry:
                merged["env_args"] = _merge_env_args(merged.get("env_args", {}), top.get("env_args", {}), entry.get("env_args", {}))
            merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
            out.append(build_eval_config(merged, cache))
        except ConfigError as exc:
            if str(exc).startswith(str(p)):
                raise
            raise ConfigError(f"{where}: {exc}") from None
    return out


# --------------------------------------------------------------------------- recorded runs

REDACTED = "***"
_SECRET_KEY = re.compile(r"key|token|secret|password|credential", re.I)
# names of nested env arguments whose values are not recorded (`*_var` names a variable: kept)
_SECRET_NAME = re.compile(r"secret|passw|credential|api_?key|(^|_)token($|_)", re.I)


def redact_secrets(value: Any) -> Any:
    """`value` with the scalar values of secret-looking keys (at any depth) replaced by REDACTED."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and _SECRET_NAME.search(k) and not k.lower().endswith("_var")
                    and not isinstance(v, (dict, list)) else redact_secrets(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_secrets(x) for x in value]
    return value


def _has_redacted(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_redacted(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_redacted(v) for v in value)
    return value == REDACTED


def _recorded_definition(source: str, flag: str = "--from-run") -> tuple[dict[str, Any], str]:
    """The stored definition of a run id (run registry) or of a results directory
    (the registry's row for it, else its metadata.json), with where it came from."""
    from runs.registry import AmbiguousRunId, find_run

    p = Path(source)
    try:
        rec = find_run(source)
    except AmbiguousRunId as exc:
        raise ConfigError(f"{flag} {source}: {exc}") from None
    if rec is not None and rec.args.get("client_config"):
        return dict(rec.args or {}), f"run {rec.id}"
    if p.is_dir() or p.name == "metadata.json":
        meta_path = p / "metadata.json" if p.is_dir() else p
        try:
            meta = json.loads(meta_path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{flag} {source}: no metadata.json there") from None
        except ValueError as exc:
            raise ConfigError(f"{flag} {source}: {meta_path} is not valid JSON: {exc}") from None
        return dict(meta.get("eval_config") or {}), str(meta_path)
    if rec is None:
        raise ConfigError(f"{flag} {source}: no run {source!r} in the run registry (and not a results directory); "
                          "list the runs: vf-sandbox runs list")
    return dict(rec.args or {}), f"run {rec.id}"


def config_from_run(source: str, overrides: dict[str, Any] | None = None, flag: str = "--from-run") -> EvalConfig:
    """The run definition recorded for `source` (a run id or a results directory),
    with the given run-control overrides applied and validated again. Header values
    are never recorded (they may carry tokens): redacted ones are dropped with a warning.
    `flag` names the option in messages (--from-run: a new run; --resume: continue it)."""
    import logging

    data, where = _recorded_definition(source, flag)
    if not data.get("env_id") or "client_config" not in data:
        raise ConfigError(f"{flag} {source}: {where} holds no run definition (recorded by an older version?)")
    cc = data["client_config"]
    dropped = sorted(k for k, v in (cc.get("extra_headers") or {}).items() if v == REDACTED)
    cc["extra_headers"] = {k: v for k, v in (cc.get("extra_headers") or {}).items() if v != REDACTED}
    for ep in cc.get("endpoint_configs") or []:
        dropped += sorted(k for k, v in (ep.get("extra_headers") or {}).items() if v == REDACTED)
        ep["extra_headers"] = {k: v for k, v in (ep.get("extra_headers") or {}).items() if v != REDACTED}
    if dropped:
        logging.getLogger("envs.runner").warning(
            "--from-run: header value(s) %s were not recorded (they may hold secrets); running without them",
            ", ".join(sorted(set(dropped))))
    for key in ("resume", "resume_path", "extend", "run_id", *PROCESS_FIELDS):  # a rerun is a new run unless asked to resume
        data.pop(key, None)
    overrides = dict(overrides or {})
    client_retries = overrides.pop("client_max_retries", None)
    if client_retries is not None:  # the client's own retries live in the client config
        for c in [cc, *(cc.get("endpoint_configs") or [])]:
            c["max_retries"] = client_retries
    data.update({k: v for k, v in overrides.items() if v is not None})
    secret_opts = sorted(k for k, v in (data.get("backend_options") or {}).items() if v == REDACTED)
    if secret_opts:
        raise ConfigError(f"{flag} {source}: backend option(s) {', '.join(secret_opts)} look secret and were not "
                          "recorded; pass them with --backend-options (better: name an environment variable)")
    if _has_redacted(data.get("env_args")) or _has_redacted(data.get("extra_env_kwargs")):
        raise ConfigError(f"{flag} {source}: secret-looking environment argument(s) were not recorded; pass them "
                          "again with -a / -x (better: name an environment variable)")
    if data.get("backend") not in backend_names():
        raise ConfigError(f"unknown sandbox backend {data.get('backend')!r}; known: {', '.join(backend_names())}")
    n = data.get("num_examples")
    if isinstance(n, int) and (n == 0 or n < -1):
        raise ConfigError(f"num_examples (-n) must be a positive number of examples, or -1 for the whole dataset; got {n}")
    try:
        return EvalConfig.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"{flag} {source}: the recorded definition is not valid here: {exc}") from None


def with_running_settings(cfg: EvalConfig) -> EvalConfig:
    """The definition with its sandboxes' label and its process settings filled in from
    the running settings (`sandboxes.settings.current()`: the entry's scope) where it names
    none, as the runner, its -w workers and Ray actors run it."""
    running = current_settings()
    update: dict[str, Any] = {}
    if cfg.sandbox_run_id is None:
        update["sandbox_run_id"] = running.sandbox_run_id
    if cfg.settings is None:
        update["settings"] = running.model_copy(update=RUN_IDS)
    return cfg.model_copy(update=update) if update else cfg


def with_process_settings(configs: list[EvalConfig], settings: ProcessSettings) -> list[EvalConfig]:
    """The definitions as this process runs them: what the process environment said
    (`sandboxes.settings.ProcessSettings`, read once by the command's entry) goes into
    the definitions (`settings`, the ids into their own fields), which carry it down
    (workers, Ray actors); nothing below reads it again. `$VF_RUN_ID` (the dashboard's
    chosen id) is the first new run's id."""
    out, run_id = [], settings.run_id
    carried = settings.model_copy(update=RUN_IDS)
    for cfg in configs:
        update: dict[str, Any] = {} if cfg.settings is not None else {"settings": carried}
        if cfg.runs_db is None and settings.runs_db:
            update["runs_db"] = settings.runs_db
        if cfg.sandbox_run_id is None and settings.sandbox_run_id:
            update["sandbox_run_id"] = settings.sandbox_run_id
        if run_id and cfg.run_id is None and not cfg.resume:
            update["run_id"], run_id = run_id, None
        out.append(cfg.model_copy(update=update) if update else cfg)
    return out
