"""The package list, which pyproject.toml cannot express: ``npu_rl/`` plus the design card's top-level folders
``kernels/`` (the fused Triton kernels and their plain torch versions) and ``configs/`` (the Hydra YAML), installed and
imported as ``npu_rl.kernels`` and ``npu_rl.configs``. setuptools' ``package_dir`` does the mapping for a wheel and for
an editable install alike; everything else about the package is in pyproject.toml."""

from setuptools import find_packages, setup

TOP_LEVEL = {"npu_rl.kernels": "kernels", "npu_rl.configs": "configs"}

setup(packages=find_packages(include=["npu_rl", "npu_rl.*"]) + sorted(TOP_LEVEL), package_dir=TOP_LEVEL)
