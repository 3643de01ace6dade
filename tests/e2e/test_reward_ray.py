"""A custom reward function under a real Ray worker: loaded there by file path, nothing user-defined pickled.

verl #3150: users' reward functions failed to pickle into Ray workers. Here the manager is built in the driver,
shipped to an actor (it pickles as a file path and a function name) and called there; the function's module is
never importable in the actor except by that path. A second call runs the reward pool inside the actor.
"""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

from tests.helpers import make_tiny_tokenizer
from tests.reward.common import config, make_batch, write_custom

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray




@ray.remote
class RewardActor:
    def score(self, manager, batch):
        import sys

        result = manager(batch)
        loaded = [name for name in sys.modules if name.startswith("npu_rl_user_")]
        manager.close()
        return result.token_level_scores.sum(-1).tolist(), list(result.extra["seen_index"]), os.getpid(), loaded


def test_custom_reward_function_inside_a_ray_actor(ray_session, tmp_path):
    path = write_custom(tmp_path)
    tok = make_tiny_tokenizer()
    cfg = config(path=path, name="exact")
    cfg.custom_reward_function.reward_kwargs = {"bonus": 0.5}
    from npu_rl.reward import build_reward_manager

    manager = build_reward_manager(cfg, tok)
    module = "npu_rl_user_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    assert module not in sys.modules  # building the manager does not load the function in the driver
    batch = make_batch(tok, ["5", "6", "7"], ["5", "5", "7"])
    actor = RewardActor.remote()
    scores, seen, pid, loaded = ray.get(actor.score.remote(manager, batch), timeout=120)
    assert scores == [1.5, 0.5, 1.5] and seen == [0, 1, 2]
    assert pid != os.getpid() and loaded == [module]  # loaded by path in the actor's process
    assert module not in sys.modules
    # the same with the reward pool started inside the actor
    cfg.reward_model.num_workers = 1
    scores, _, _, _ = ray.get(actor.score.remote(build_reward_manager(cfg, tok), batch), timeout=120)
    assert scores == [1.5, 0.5, 1.5]
