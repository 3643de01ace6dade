"""Hydra presets (YAML). Shipped inside the package as npu_rl.configs; the folder is configs/ in the repo."""
