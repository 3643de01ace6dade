"""The worker tests share the trainer tests' tiny runs (config overrides, the learnable reward file)."""

from tests.trainer.conftest import reward_file  # noqa: F401  (a fixture)
