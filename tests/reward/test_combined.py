"""The Python API's ``reward_funcs=[...]`` runs the user's functions through ``npu_rl/reward/combined.py``: an error
names the user's function (file and name), not only the wrapper (issue 39: the message named combined.py)."""

from __future__ import annotations

import pytest

from npu_rl.reward.combined import compute_score
from npu_rl.reward.score_fn import RewardFunctionError


def test_an_error_names_the_users_function(tmp_path):
    user = tmp_path / "my_rewards.py"
    user.write_text("def fine(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n\n"
                    "def broken(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return {'x': 1}['missing']\n")
    refs = [f"{user}:fine", f"{user}:broken"]
    with pytest.raises(RewardFunctionError, match=f"reward function {user}:broken raised KeyError: 'missing'"):
        compute_score("d", "s", "1", reward_funcs=refs)
    assert compute_score("d", "s", "1", reward_funcs=refs[:1]) == {"score": 1.0, "acc": 1.0}
