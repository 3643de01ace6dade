"""Session-wide process pools for the distributed tests (see dist_pool.py)."""

from __future__ import annotations

import pytest

from tests.parallel.dist_pool import DistPool


@pytest.fixture(scope="session")
def dist_pool2():
    pool = DistPool(2)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def dist_pool1():
    pool = DistPool(1)
    yield pool
    pool.close()
