"""The `prime` backend: sandboxes on Prime Intellect through the prime-sandboxes
SDK, the shared agent over one SDK live process. Contract-tested against a fake
of the Prime API only (see backends/README.md)."""

from .backend import API_KEY_VAR, PrimeBackend, PrimeConfig, PrimeSandbox
from .errors import PrimeImagePullError, PrimeOOMKilled, PrimePaymentRequired, PrimeSandboxTimeout, map_error

__all__ = ["API_KEY_VAR", "PrimeBackend", "PrimeConfig", "PrimeSandbox", "PrimeImagePullError", "PrimeOOMKilled",
           "PrimePaymentRequired", "PrimeSandboxTimeout", "map_error"]
