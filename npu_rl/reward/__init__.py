"""Rewards: rule scorers by data source, reward managers, custom reward functions by file path.

The names below are imported lazily: a reward-pool worker imports this package and needs only the scorers, not
torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_reward_manager": "npu_rl.reward.build",
    "check_reward_config": "npu_rl.reward.build",
    "reward_settings": "npu_rl.reward.build",
    "REWARD_MANAGERS": "npu_rl.reward.managers",
    "RewardResult": "npu_rl.reward.managers",
    "RewardSettings": "npu_rl.reward.managers",
    "OverlongBuffer": "npu_rl.reward.managers",
    "overlong_penalty": "npu_rl.reward.managers",
    "SCORERS": "npu_rl.reward.scorers",
    "default_compute_score": "npu_rl.reward.scorers",
    "ScoreFnSpec": "npu_rl.reward.score_fn",
    "RewardFunctionError": "npu_rl.reward.score_fn",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'npu_rl.reward' has no attribute {name!r}")
