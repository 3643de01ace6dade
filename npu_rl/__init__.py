"""npu-rl: Ascend-NPU-first RL post-training of LLMs with verl's workflow."""

__version__ = "0.1.0"
