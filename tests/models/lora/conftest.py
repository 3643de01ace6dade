"""The rollout test model and the trainer's reward file, for the LoRA tests (the gloo pools are in tests/conftest.py)."""

from tests.rollout.conftest import eos_model_dir  # noqa: F401
from tests.trainer.conftest import reward_file  # noqa: F401
