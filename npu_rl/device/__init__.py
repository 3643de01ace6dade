"""Device layer: the only package that names npu / cuda / cpu. See :mod:`npu_rl.device.backend`."""

from npu_rl.device.backend import (
    VALID_DEVICES,
    Backend,
    DeviceUnavailableError,
    get_backend,
    make_backend,
    reset_backend_for_tests,
    select_backend,
)

__all__ = [
    "VALID_DEVICES",
    "Backend",
    "DeviceUnavailableError",
    "get_backend",
    "make_backend",
    "reset_backend_for_tests",
    "select_backend",
]
