"""The gloo process pools of tests/parallel, for the distributed LoRA tests."""

from tests.parallel.conftest import dist_pool2  # noqa: F401
