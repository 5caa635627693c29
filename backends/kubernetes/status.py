"""Reading a pod's status: is it ready, still starting, or failed, and which
typed `InfraError` names the failure. The pod's own reason and message are
always part of the error text; classification uses the structured fields
(phase, container state reasons, conditions), never the message."""

from __future__ import annotations

from typing import Any, Literal

from sandboxes.errors import SandboxCreateError, SandboxNotRunning


class PodImagePullError(SandboxCreateError):
    """The image could not be pulled (ImagePullBackOff, ErrImagePull, InvalidImageName...)."""


class PodUnschedulable(SandboxCreateError):
    """No node can take the pod (resources, selectors, taints) within the grace period."""


class PodStartError(SandboxCreateError):
    """The container could not be created or started (CreateContainerConfigError, ...)."""


class PodOOMKilled(SandboxNotRunning):
    """The sandbox's main container was OOM-killed: the whole sandbox is gone."""


class PodEvicted(SandboxNotRunning):
    """The kubelet evicted the pod (node pressure, ephemeral-storage limit...)."""


class PodDeadlineExceeded(SandboxNotRunning):
    """The pod outlived activeDeadlineSeconds (the spec's timeout_minutes)."""


class PodTerminated(SandboxNotRunning):
    """The pod's container exited or the pod is Failed/Succeeded/being deleted."""


_PULL_REASONS = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
_START_REASONS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff", "StartError"}

State = Literal["ready", "pending", "unschedulable", "failed"]


def _container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return list(status.get("containerStatuses") or []) + list(status.get("initContainerStatuses") or [])


def classify(pod: dict[str, Any]) -> tuple[State, Exception | None]:
    """(state, error): `ready` = Running with every container running; `pending` = keep
    waiting; `unschedulable` = waiting but the scheduler said no (error to raise after the
    grace period); `failed` = give up now with `error`."""
    name = (pod.get("metadata") or {}).get("name", "?")
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "failed", PodTerminated(f"pod {name} is being deleted")
    for cs in _container_statuses(pod):
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason") or ""
        msg = waiting.get("message") or ""
        if reason in _PULL_REASONS:
            return "failed", PodImagePullError(f"pod {name}: {reason}: {msg or cs.get('image', '')}".rstrip(": "))
        if reason in _START_REASONS:
            return "failed", PodStartError(f"pod {name}: {reason}: {msg}".rstrip(": "))
        term = state.get("terminated")
        if term:
            return "failed", _terminated_error(name, term)
    if phase in ("Failed", "Succeeded"):
        reason = status.get("reason") or ""
        msg = status.get("message") or ""
        if reason == "Evicted":
            return "failed", PodEvicted(f"pod {name} was evicted: {msg}".rstrip(": "))
        if reason == "DeadlineExceeded":
            return "failed", PodDeadlineExceeded(f"pod {name}: DeadlineExceeded: {msg}".rstrip(": "))
        return "failed", PodTerminated(f"pod {name} is {phase}: {reason} {msg}".strip())
    if phase == "Running":
        statuses = status.get("containerStatuses") or []
        if statuses and all("running" in (cs.get("state") or {}) for cs in statuses):
            return "ready", None
        return "pending", None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return "unschedulable", PodUnschedulable(f"pod {name}: Unschedulable: {cond.get('message', '')}".rstrip(": "))
    return "pending", None


def _terminated_error(name: str, term: dict[str, Any]) -> Exception:
    reason = term.get("reason") or ""
    detail = f"exit code {term.get('exitCode')}" + (f", {term['message']}" if term.get("message") else "")
    if reason == "OOMKilled":
        return PodOOMKilled(f"pod {name}: OOMKilled ({detail})")
    return PodTerminated(f"pod {name}: container terminated: {reason or 'Error'} ({detail})")


def pod_error(pod: dict[str, Any] | None, name: str) -> Exception:
    """The error describing why a sandbox pod is not usable (pod None = gone)."""
    if pod is None:
        return PodTerminated(f"pod {name} no longer exists")
    state, err = classify(pod)
    if err is not None:
        return err
    return PodTerminated(f"pod {name} is not running (phase {(pod.get('status') or {}).get('phase')})")
