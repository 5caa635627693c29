"""Pure functions from a `SandboxSpec` to Kubernetes objects (plain JSON dicts):
the sandbox pod, the deny-all NetworkPolicy, label sanitising and selectors.

Kubernetes label values are at most 63 characters of `[A-Za-z0-9._-]`,
starting and ending alphanumeric; our labels (lifecycle labels, user labels)
may not be. Every label is therefore written twice: a sanitised value in
`metadata.labels` (what selectors match) and the exact dict, as JSON, in the
annotation `vf-sandbox/labels` (what `list()` returns).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any

from sandboxes import labels as lc
from sandboxes.errors import ConfigError
from sandboxes.spec import SandboxSpec

from .config import KubernetesConfig

LABELS_ANNOTATION = "vf-sandbox/labels"
SPEC_ANNOTATION = "vf-sandbox/spec"
NETWORK_LABEL = "vf-sandbox.network"  # "off" on pods the deny-all policy selects
_KEY_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_BAD_VALUE_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def label_value(value: str) -> str:
    """A valid Kubernetes label value standing for `value` (identity when already valid).

    Invalid or long values become a readable prefix plus a hash, so different
    values never collide and the same value always maps the same way.
    """
    if len(value) <= 63 and (value == "" or _KEY_NAME.match(value)):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    head = _BAD_VALUE_CHARS.sub("_", value)[:50].strip("._-") or "v"
    return f"{head}.{digest}"


def label_key(key: str) -> str:
    """A label key must be `[prefix/]name` with a DNS prefix and a 63-char name; refuse others."""
    prefix, _, name = key.rpartition("/")
    if not _KEY_NAME.match(name) or (prefix and not re.match(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$", prefix)):
        raise ConfigError(f"label key {key!r} is not a valid Kubernetes label key")
    return key


def selector(labels: dict[str, str]) -> str:
    """Equality-based label selector for `labels` (always including the managed label)."""
    want = {lc.MANAGED: "true", **labels}
    return ",".join(f"{label_key(k)}={label_value(v)}" for k, v in sorted(want.items()))


def pod_name(spec: SandboxSpec) -> str:
    """A unique DNS-1123 pod name from the spec's name prefix."""
    base = re.sub(r"[^a-z0-9-]", "-", spec.name.lower()).strip("-")[:40] or "sandbox"
    return f"{base}-{uuid.uuid4().hex[:10]}"


def _quantity_mi(gib: float) -> str:
    return f"{max(1, round(gib * 1024))}Mi"


def _cpu(cores: float) -> str:
    return f"{max(1, round(cores * 1000))}m"


def _user_context(user: str | None) -> dict[str, Any]:
    """securityContext fields for `spec.user` (numeric uid[:gid] only; names need the image's passwd)."""
    if user is None:
        return {}
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        raise ConfigError(
            f"the kubernetes backend needs a numeric user (uid or uid:gid), got {user!r}: "
            "pod securityContext cannot resolve user names"
        )
    ctx: dict[str, Any] = {"runAsUser": int(uid), "runAsNonRoot": int(uid) != 0}
    if gid:
        ctx["runAsGroup"] = int(gid)
    return ctx


def pod_manifest(spec: SandboxSpec, cfg: KubernetesConfig, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The Pod for one sandbox. `labels` = user labels + lifecycle labels (exact values)."""
    meta_labels = _metadata_labels(spec, labels)
    pod_spec = _pod_spec(spec, cfg, _container(spec, cfg))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": meta_labels,
            "annotations": {
                LABELS_ANNOTATION: json.dumps(labels, sort_keys=True),
                SPEC_ANNOTATION: spec.model_dump_json(),
            },
        },
        "spec": pod_spec,
    }


def _metadata_labels(spec: SandboxSpec, labels: dict[str, str]) -> dict[str, str]:
    """The pod's sanitised labels (what selectors match), plus network=off for the deny-all
    policy when the spec has no network."""
    meta_labels = {label_key(k): label_value(v) for k, v in labels.items()}
    if not spec.network:
        meta_labels[NETWORK_LABEL] = "off"
    return meta_labels


def _container(spec: SandboxSpec, cfg: KubernetesConfig) -> dict[str, Any]:
    """The sandbox's one container: the spec's image, command, environment, working directory and
    resources (requests = limits), no privilege escalation and every capability dropped."""
    resources = {
        "cpu": _cpu(spec.cpu_cores),
        "memory": _quantity_mi(spec.memory_gb),
        "ephemeral-storage": _quantity_mi(spec.disk_size_gb),
    }
    if spec.gpu_count:
        resources["nvidia.com/gpu"] = str(spec.gpu_count)
    container_ctx: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        **_user_context(spec.user),
    }
    container: dict[str, Any] = {
        "name": cfg.container_name,
        "image": spec.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["/bin/sh", "-c", spec.start_command],
        "env": [{"name": k, "value": v} for k, v in spec.environment_vars.items()],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": container_ctx,
        "stdin": False,
        "tty": False,
    }
    if spec.workdir and spec.workdir != "/":
        container["workingDir"] = spec.workdir
    return container


def _pod_spec(spec: SandboxSpec, cfg: KubernetesConfig, container: dict[str, Any]) -> dict[str, Any]:
    """The pod's spec around `container`: never restarted, no service-account token or service
    links, the spec's lifetime as its deadline, seccomp RuntimeDefault, the runtime class
    (gVisor's for `isolation="gvisor"`) and the config's scheduling and pull settings."""
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "activeDeadlineSeconds": max(1, int(spec.timeout_minutes * 60)),
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }
    if spec.isolation == "gvisor":
        pod_spec["runtimeClassName"] = cfg.gvisor_runtime_class
    elif cfg.runtime_class_name:
        pod_spec["runtimeClassName"] = cfg.runtime_class_name
    if cfg.node_selector:
        pod_spec["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in cfg.tolerations]
    if cfg.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in cfg.image_pull_secrets]
    if cfg.service_account_name:
        pod_spec["serviceAccountName"] = cfg.service_account_name
    return pod_spec


def deny_all_network_policy(cfg: KubernetesConfig) -> dict[str, Any]:
    """A NetworkPolicy denying all ingress and egress of pods labelled network=off."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": cfg.network_policy_name, "namespace": cfg.namespace, "labels": {lc.MANAGED: "true"}},
        "spec": {
            "podSelector": {"matchLabels": {NETWORK_LABEL: "off"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def labels_of(pod: dict[str, Any]) -> dict[str, str]:
    """The exact labels of a sandbox pod (from the annotation; metadata labels as a fallback)."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(LABELS_ANNOTATION)
    if raw:
        try:
            return dict(json.loads(raw))
        except (ValueError, TypeError):
            pass
    return {k: v for k, v in (meta.get("labels") or {}).items() if k != NETWORK_LABEL}


def spec_of(pod: dict[str, Any]) -> SandboxSpec | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(SPEC_ANNOTATION)
    if not raw:
        return None
    try:
        return SandboxSpec.model_validate_json(raw)
    except ValueError:
        return None
