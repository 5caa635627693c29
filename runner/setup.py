"""Turning a run definition into live objects, the same way in the runner's
process and in every worker process: the environment (loaded, given the
run's backend, retry policy, `-x` settings and concurrency) and the model
clients (keys resolved by variable name, endpoints checked when asked)."""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlparse

from sandboxes.errors import ConfigError, UsageError

from envs.clients.config import DEFAULT_BASE_URL, DEFAULT_KEY_VAR
from runner.config import EvalConfig


def load_run_env(cfg: EvalConfig, concurrency: int | None = None) -> Any:
    """The environment of `cfg`, configured by it. `concurrency` defaults to the run's."""
    from envs.loader import load_environment

    env = load_environment(cfg.env_id, env_dir=cfg.env_dir_path, **cfg.env_args)
    env.set_backend(cfg.backend, cfg.backend_options)
    env.set_retry_policy(cfg.retry_policy())
    env.rollout_timeout = cfg.rollout_timeout  # the whole rollout bounded (local, -w N and hosted alike)
    if cfg.retry_rules:  # which errors retry a rollout: the run's rules (local, -w N and hosted alike)
        from runner.config import retry_predicate

        env.retry_if = retry_predicate(cfg.retry_rules, cfg.max_retries)
    if cfg.isolation is not None:
        env.set_isolation(cfg.isolation)
    if cfg.extra_env_kwargs:
        env.set_kwargs(**cfg.extra_env_kwargs)
    if "concurrency" not in cfg.extra_env_kwargs:
        if concurrency is None:
            total = cfg.num_examples * cfg.rollouts_per_example if cfg.num_examples > 0 else 0
            concurrency = min(cfg.max_concurrent, total) if cfg.max_concurrent > 0 and total else (
                cfg.max_concurrent if cfg.max_concurrent > 0 else total or 32)
        env.set_concurrency(concurrency)
    return env


def check_endpoint(base_url: str, timeout: float = 3.0, key_var: str | None = None) -> None:
    """Fail fast with a clear message when nothing listens at the model endpoint
    (naming the URL tried and the variable the API key is read from)."""
    parsed = urlparse(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"model endpoint {base_url!r} is not an http(s) URL")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            pass
    except OSError as exc:
        why = "DNS lookup failed: no network, or a wrong host name" if isinstance(exc, socket.gaierror) else (
            exc.strerror or str(exc))
        key = ""
        if key_var and key_var != "EMPTY":
            key = f"; its API key is read from ${key_var} ({'set' if os.environ.get(key_var) else 'not set'})"
        default = ""
        if base_url.rstrip("/") == DEFAULT_BASE_URL:
            default = (f" (the default endpoint, Prime Inference: it needs network access and ${DEFAULT_KEY_VAR}; "
                       "for a local server pass -m ALIAS or -b URL)")
        running = "; is the server running?" if isinstance(exc, ConnectionRefusedError) else ""
        raise UsageError(
            f"model endpoint {base_url} is not reachable ({why}){default}{key}{running} "
            "(check -m / -b or the endpoints registry)"
        ) from None


DEFAULT_MODEL_REQUEST_TIMEOUT = 600.0
"""Seconds a model request of an eval may take when neither --rollout-timeout nor the
endpoint's own `timeout` says (the clients' library default, 3600 s, times the client retries
was an hour and more of silence on a hanging endpoint)."""


def make_run_clients(cfg: EvalConfig, env: Any, check: bool = True) -> list[Any]:
    """One client per endpoint replica. An env that never calls a model
    (`requires_model = False`, e.g. SWE debugging) needs no key and no live endpoint."""
    from envs.clients import make_client

    replicas = [c if "timeout" in c.model_fields_set else c.model_copy(update={"timeout": DEFAULT_MODEL_REQUEST_TIMEOUT})
                for c in cfg.client_config.replicas()]
    if cfg.rollout_timeout:  # a model request never outlives its rollout (not 3600 s x retries, silently)
        replicas = [c.model_copy(update={"timeout": min(c.timeout, cfg.rollout_timeout),
                                         "connect_timeout": min(c.connect_timeout, cfg.rollout_timeout)})
                    for c in replicas]
    if not env.requires_model:
        return [make_client(c.model_copy(update={"api_key_var": "EMPTY"})) for c in replicas]
    clients = [make_client(c) for c in replicas]  # resolves API keys (MissingKeyError)
    if check:
        for replica in replicas:
            check_endpoint(replica.api_base_url, key_var=replica.api_key_var)
    return clients
