from tests.trainer.conftest import reward_file  # noqa: F401  (the trainer tests' reward fixture)
