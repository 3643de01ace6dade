"""The end-to-end lane's fixtures: those of the rooms its tests came from (the trainer's reward file, the rollout's
tiny model vLLM's CPU kernels accept, the kernels' device); the gloo process pools are tests/conftest.py's."""

from tests.kernels.conftest import device, needs_triton  # noqa: F401
from tests.rollout.conftest import eos_model_dir, eos_model_dir_other_weights  # noqa: F401
from tests.trainer.conftest import reward_file  # noqa: F401
