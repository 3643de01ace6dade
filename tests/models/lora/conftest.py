"""The gloo process pools of tests/parallel and the rollout test model, for the LoRA tests."""

from tests.parallel.conftest import dist_pool2  # noqa: F401
from tests.rollout.conftest import eos_model_dir  # noqa: F401
from tests.trainer.conftest import reward_file  # noqa: F401
