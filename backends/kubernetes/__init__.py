"""The `kubernetes` backend: a pod per sandbox, the shared agent over the
pods/exec websocket. Contract-tested against a fake API server only (see
backends/README.md); run `VF_K8S_CONTEXT=<ctx> pytest -m k8s` on a real cluster."""

from .backend import KubernetesBackend, KubeSandbox
from .config import KubernetesConfig
from .status import (
    PodDeadlineExceeded,
    PodEvicted,
    PodImagePullError,
    PodOOMKilled,
    PodStartError,
    PodTerminated,
    PodUnschedulable,
)

__all__ = ["KubernetesBackend", "KubeSandbox", "KubernetesConfig", "PodDeadlineExceeded", "PodEvicted",
           "PodImagePullError", "PodOOMKilled", "PodStartError", "PodTerminated", "PodUnschedulable"]
