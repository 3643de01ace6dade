"""From the config to a reward manager, and the checks the config validator runs before anything heavy starts.

Keys read: ``reward_model.{reward_manager, overlong_buffer, num_workers, timeout_s, batch_timeout_s, tolerate_errors}``,
``custom_reward_function.{path, name, reward_kwargs}``, ``data.{reward_fn_key, max_response_length}``.
``custom_reward_function.reward_kwargs`` go to the reward function, the default rule scorers included (e.g.
``{method: flexible}`` for GSM8K). verl passes ``reward_model.reward_kwargs`` to its manager's constructor; here
every manager has one constructor, so those are not used, and a non-empty value is reported at validation.
"""

from __future__ import annotations

import logging
from typing import Any

from npu_rl.reward.managers import (
    REWARD_MANAGERS,
    OverlongBuffer,
    RewardSettings,
    check_overlong_buffer,
)
from npu_rl.reward.score_fn import ScoreFnSpec

logger = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain dicts/lists (they must pickle into pool workers and Ray actors)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def score_fn_spec(custom_reward_cfg, batched: bool) -> ScoreFnSpec:
    path = getattr(custom_reward_cfg, "path", None) if custom_reward_cfg is not None else None
    name = (getattr(custom_reward_cfg, "name", None) if custom_reward_cfg is not None else None) or "compute_score"
    kwargs = _plain(getattr(custom_reward_cfg, "reward_kwargs", None) if custom_reward_cfg is not None else None)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"custom_reward_function.reward_kwargs must be a mapping, got {type(kwargs).__name__}")
    return ScoreFnSpec(path=path or None, name=str(name), kwargs=dict(kwargs or {}), batched=batched)


def reward_settings(config, validation: bool = False) -> RewardSettings:
    rm = config.reward_model
    manager_cls = REWARD_MANAGERS.get(rm.reward_manager)
    buffer = rm.overlong_buffer
    return RewardSettings(
        score_fn=score_fn_spec(config.custom_reward_function, getattr(manager_cls, "batched", False)),
        reward_fn_key=str(config.data.reward_fn_key),
        max_response_length=int(buffer.max_resp_len if getattr(buffer, "max_resp_len", None) is not None
                                else config.data.max_response_length),
        overlong_buffer=OverlongBuffer(bool(buffer.enable), int(buffer.len), float(buffer.penalty_factor),
                                       bool(getattr(buffer, "log", False))),
        num_workers=int(rm.num_workers),
        timeout_s=float(rm.timeout_s),
        batch_timeout_s=float(rm.batch_timeout_s),
        tolerate_errors=bool(rm.tolerate_errors),
        num_examine=1 if validation else 0,
    )


def build_reward_manager(config, tokenizer, validation: bool = False):
    """The manager named by ``reward_model.reward_manager`` (a registered name or a plug-in ``file.py:Class``).

    ``validation`` only logs one decoded sample per data source (INFO). The manager pickles as its settings, so it
    can be built here and shipped to a Ray worker; the reward function is loaded where the manager runs.
    """
    settings = reward_settings(config, validation)
    manager_cls = REWARD_MANAGERS.get(config.reward_model.reward_manager)
    return manager_cls(tokenizer, settings)


def check_reward_config(reward_model_cfg, custom_reward_cfg, data_cfg=None) -> None:
    """Fail now, with the key to fix, if building or running the reward manager would fail later."""
    name = reward_model_cfg.reward_manager
    manager_cls = REWARD_MANAGERS.get(name)  # unknown: lists the known names
    if not callable(manager_cls):
        raise TypeError(f"reward_model.reward_manager={name!r} is a {type(manager_cls).__name__}, not a class")
    if int(reward_model_cfg.num_workers) < 0:
        raise ValueError(f"reward_model.num_workers must be >= 0, got {reward_model_cfg.num_workers}")
    if float(reward_model_cfg.timeout_s) <= 0:
        raise ValueError(f"reward_model.timeout_s must be > 0, got {reward_model_cfg.timeout_s}")
    if float(getattr(reward_model_cfg, "batch_timeout_s", 1.0)) <= 0:
        raise ValueError(f"reward_model.batch_timeout_s must be > 0, got {reward_model_cfg.batch_timeout_s}")
    buffer = reward_model_cfg.overlong_buffer
    dapo = REWARD_MANAGERS.get("dapo")
    if buffer.enable and not (isinstance(manager_cls, type) and issubclass(manager_cls, dapo)):
        raise ValueError(f"reward_model.overlong_buffer.enable=True needs reward_model.reward_manager=dapo "
                         f"(it is {name!r}, which would ignore the buffer)")
    max_len = int(data_cfg.max_response_length) if data_cfg is not None else None
    if getattr(buffer, "max_resp_len", None) is not None:  # verl's dapo manager's own max_resp_len
        max_len = int(buffer.max_resp_len)
    if buffer.enable:
        check_overlong_buffer(buffer, max_len if max_len is not None else int(buffer.len))
    if _plain(getattr(reward_model_cfg, "reward_kwargs", None)):
        logger.warning("reward_model.reward_kwargs is not used by npu-rl's reward managers; put keyword arguments "
                       "for the reward function in custom_reward_function.reward_kwargs")
    spec = score_fn_spec(custom_reward_cfg, getattr(manager_cls, "batched", False))
    if spec.path is not None or spec.kwargs:
        spec.load()  # file, import, name, callable, signature (with the kwargs)
