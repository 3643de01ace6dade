"""Running from a source checkout (a clone, or the folder ``ray job submit --working-dir .`` uploaded): the
checkout's ``configs/`` and ``kernels/`` are ``npu_rl.configs`` and ``npu_rl_kernels``, as they are once installed
(pyproject.toml maps the two folders to these names).

Without this, a clone that was never ``pip install``-ed has no ``npu_rl.configs``, and a Ray job on a node where
npu-rl is installed would take its configs and kernels from the installed copy, not from the uploaded folder. The
finder answers only for those two names, and only when ``npu_rl`` itself was imported from a checkout (a folder
with pyproject.toml, configs/ and kernels/ beside the package); an installed wheel is left alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys


class SourceTreeFinder(importlib.abc.MetaPathFinder):
    def __init__(self, packages: dict[str, str]):
        self.packages = packages  # module name -> folder holding its __init__.py

    def find_spec(self, fullname, path=None, target=None):
        folder = self.packages.get(fullname)
        if folder is None:
            return None  # submodules are found through the package's __path__ as usual
        return importlib.util.spec_from_file_location(fullname, os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])


def checkout_root(package_dir: str) -> str | None:
    root = os.path.dirname(os.path.abspath(package_dir))
    if all(os.path.exists(os.path.join(root, p)) for p in ("pyproject.toml", "configs/__init__.py",
                                                             "kernels/__init__.py")):
        return root
    return None


def install(package_dir: str) -> SourceTreeFinder | None:
    root = checkout_root(package_dir)
    if root is None:
        return None
    for finder in sys.meta_path:
        if isinstance(finder, SourceTreeFinder):
            return finder
    finder = SourceTreeFinder({"npu_rl.configs": os.path.join(root, "configs"),
                               "npu_rl_kernels": os.path.join(root, "kernels")})
    sys.meta_path.insert(0, finder)
    return finder
