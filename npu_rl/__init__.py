"""npu-rl: Ascend-NPU-first RL post-training of LLMs with verl's workflow."""

__version__ = "0.1.0"


def _use_checkout_folders() -> None:
    import os

    from npu_rl._source_tree import install

    install(os.path.dirname(__file__))


_use_checkout_folders()
