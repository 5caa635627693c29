"""`KubernetesConfig`: every knob of the Kubernetes backend, documented on its field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandboxes.retry import RetryPolicy
from sandboxes import settings


def _env(name: str) -> str | None:
    """A VF_K8S_* setting of the running settings (`sandboxes.settings.current()`), taken
    when a config is made: the backend is made in the run's scope, so an option the run
    definition gives wins and the process settings fill the rest."""
    return getattr(settings.current(), name.removeprefix("VF_").lower())


class KubernetesConfig(BaseModel):
    """Where and how sandbox pods are created. Pass as keyword arguments to
    `get_backend("kubernetes", ...)` or `KubernetesBackend(...)`; CLIs that only
    name the backend get the defaults, with context, namespace and runtime class
    from the running settings ($VF_K8S_CONTEXT, $VF_K8S_NAMESPACE, $VF_K8S_RUNTIME_CLASS
    as the process's entry read them)."""

    model_config = ConfigDict(extra="forbid")

    context: str | None = Field(default_factory=lambda: _env("VF_K8S_CONTEXT"), description="kubeconfig context; default $VF_K8S_CONTEXT, else the current context.")
    kubeconfig: str | None = Field(None, description="kubeconfig path; None = $KUBECONFIG or ~/.kube/config.")
    in_cluster: bool | None = Field(None, description="Use the pod's service account; None = auto (in-cluster when $KUBERNETES_SERVICE_HOST is set and no kubeconfig given).")
    namespace: str = Field(default_factory=lambda: _env("VF_K8S_NAMESPACE") or "default", description="Namespace of sandbox pods (must exist); default $VF_K8S_NAMESPACE or 'default'.")
    container_name: str = Field("sandbox", description="Name of the one container of each pod.")
    image_pull_policy: str = Field("IfNotPresent", description="imagePullPolicy of the container.")
    runtime_class_name: str | None = Field(default_factory=lambda: _env("VF_K8S_RUNTIME_CLASS"), description="runtimeClassName, e.g. 'gvisor' or 'kata'; default $VF_K8S_RUNTIME_CLASS.")
    gvisor_runtime_class: str = Field("gvisor", description="runtimeClassName of pods whose spec asks for isolation='gvisor' (GKE Sandbox names it 'gvisor').")
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector of every pod.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Tolerations (Kubernetes JSON form).")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Names of image pull secrets.")
    service_account_name: str | None = Field(None, description="serviceAccountName; its token is never mounted.")
    create_network_policy: bool = Field(True, description="Create (once) the deny-all NetworkPolicy selecting sandboxes whose spec has network=False.")
    network_policy_name: str = Field("vf-sandbox-deny-all", description="Name of that NetworkPolicy.")
    creates_per_second: float = Field(5.0, gt=0, description="Pod creations per second allowed (token bucket) so the API server is not flooded.")
    create_burst: int = Field(10, ge=1, description="Creations allowed at once before the rate applies.")
    ready_timeout: float = Field(300.0, gt=0, description="Seconds to wait for Running + the exec readiness probe.")
    unschedulable_grace: float = Field(30.0, ge=0, description="Seconds a pod may stay Unschedulable (autoscaler headroom) before creation fails.")
    poll_interval: float = Field(0.5, gt=0, description="Seconds between pod status polls while waiting.")
    keepalive: float = Field(30.0, gt=0, description="Seconds between websocket pings on an exec stream.")
    request_timeout: float = Field(30.0, gt=0, description="Seconds per REST call to the API server.")
    python: str = Field("python3", description="Python interpreter inside the image that runs the agent.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Retry of every REST call to the API server (all idempotent: a create repeats the same pod name, a 409 adopts it) on 408/429/5xx and connection errors, honouring Retry-After.")
