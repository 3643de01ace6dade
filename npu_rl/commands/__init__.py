"""The commands a user runs besides training: benchmarks (kernels, rollout, trainer, LoRA, profile), parity, eval,
merge and doctor. Only ``npu_rl.cli`` imports this room; the library's rooms hold what a training step needs."""
