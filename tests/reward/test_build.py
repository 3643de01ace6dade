"""``build_reward_manager`` and ``check_reward_config``: what the trainer and the config validator call."""

from __future__ import annotations

import asyncio

import pytest
from omegaconf import OmegaConf

from npu_rl.config.schema import PPOConfig
from npu_rl.reward import REWARD_MANAGERS, build_reward_manager, check_reward_config
from npu_rl.reward.managers import BatchRewardManager, DAPORewardManager, NaiveRewardManager
from npu_rl.reward.score_fn import RewardFunctionError, ScoreFnSpec
from tests.helpers import make_tiny_tokenizer
from tests.reward.common import config, make_batch, write_custom


@pytest.fixture
def custom(tmp_path):
    return write_custom(tmp_path)


def _check(cfg: PPOConfig):
    check_reward_config(cfg.reward_model, cfg.custom_reward_function, cfg.data)


def test_registered_managers():
    assert REWARD_MANAGERS.names() == ["batch", "dapo", "gdpo", "naive", "prime"]
    tok = make_tiny_tokenizer()
    for name, cls in (("naive", NaiveRewardManager), ("batch", BatchRewardManager), ("dapo", DAPORewardManager)):
        _check(config(name))
        assert type(build_reward_manager(config(name), tok)) is cls


def test_omegaconf_config_works_too(custom):
    cfg = OmegaConf.structured(PPOConfig)
    cfg.custom_reward_function.path = custom
    cfg.custom_reward_function.name = "exact"
    cfg.custom_reward_function.reward_kwargs = {"bonus": 1.0}
    check_reward_config(cfg.reward_model, cfg.custom_reward_function, cfg.data)
    tok = make_tiny_tokenizer()
    manager = build_reward_manager(cfg, tok, validation=True)
    assert manager.settings.score_fn.kwargs == {"bonus": 1.0} and type(manager.settings.score_fn.kwargs) is dict
    assert manager(make_batch(tok, ["5"], ["5"])).token_level_scores.sum() == 2.0


def test_unknown_manager_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown reward manager 'navie' \(config key reward_model.reward_manager\)"
                                         r"\. Did you mean 'naive'\? Known: batch, dapo, gdpo, naive"):
        _check(config("navie"))


def test_plug_in_manager_by_file(tmp_path):
    path = tmp_path / "my_manager.py"
    path.write_text("from npu_rl.reward.managers import NaiveRewardManager\n"
                    "class Mine(NaiveRewardManager):\n    pass\n")
    cfg = config(f"{path}:Mine")
    _check(cfg)
    assert type(build_reward_manager(cfg, make_tiny_tokenizer())).__name__ == "Mine"


def test_custom_function_problems_name_file_and_function(tmp_path, custom):
    missing = str(tmp_path / "nope.py")
    with pytest.raises(RewardFunctionError, match=rf"file {missing} does not exist \(looking for function 'f'\)"):
        _check(config(path=missing, name="f"))
    with pytest.raises(RewardFunctionError, match=rf"{custom} has no function 'score_it'; it defines \[.*'exact'"):
        _check(config(path=custom, name="score_it"))
    with pytest.raises(RewardFunctionError, match=rf"'NOT_A_FUNCTION' in {custom} is a int, not a function"):
        _check(config(path=custom, name="NOT_A_FUNCTION"))
    with pytest.raises(RewardFunctionError, match=rf"function 'wrong_signature' in {custom} has the signature "
                                                  r"wrong_signature\(text, answer\).*Expected verl's signature"):
        _check(config(path=custom, name="wrong_signature"))
    with pytest.raises(RewardFunctionError, match=rf"path: {tmp_path} is a folder; give the .py file inside it"):
        _check(config(path=str(tmp_path), name="f"))
    asynchronous = tmp_path / "async_reward.py"
    asynchronous.write_text("import asyncio\n"
                            "async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                            "    await asyncio.sleep(0)\n"
                            "    return {'score': float(solution_str == ground_truth),\n"
                            "            'loop': id(asyncio.get_running_loop())}\n")
    _check(config(path=str(asynchronous)))  # verl's reward loop awaits an async compute_score: run per call here
    fn = ScoreFnSpec(str(asynchronous)).load()
    assert fn(data_source="d", solution_str="4", ground_truth="4")["score"] == 1.0

    async def inside_a_loop():  # a caller that runs an event loop itself (an agent loop): the call gets its own
        return fn(data_source="d", solution_str="3", ground_truth="4")

    assert asyncio.run(inside_a_loop())["score"] == 0.0
    with pytest.raises(RewardFunctionError, match=r"compute_score\(data_source, solution_str, ground_truth, "
                                                  r"extra_info=None\).*Expected"):
        ScoreFnSpec(str(asynchronous), batched=True).load()  # its signature is still checked
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(RewardFunctionError, match=rf"cannot import {broken}.*not_a_module_anywhere"):
        _check(config(path=str(broken)))


def test_signatures_must_match_the_manager_and_the_kwargs(custom):
    with pytest.raises(RewardFunctionError, match="The batch reward manager passes lists"):
        _check(config("batch", path=custom, name="exact"))
    _check(config("batch", path=custom, name="batch_exact"))
    cfg = config(path=custom, name="as_float")
    cfg.custom_reward_function.reward_kwargs = {"bonus": 1.0}
    with pytest.raises(RewardFunctionError, match=r"\*\*\['bonus'\].*unexpected keyword argument 'bonus'"):
        _check(cfg)


def test_batch_function_returning_the_wrong_length(custom):
    tok = make_tiny_tokenizer()
    manager = build_reward_manager(config("batch", path=custom, name="batch_wrong_length"), tok)
    with pytest.raises(RewardFunctionError, match="returned a list of length 1; the batch manager expects a list of 2"):
        manager(make_batch(tok, ["1", "2"], ["1", "2"]))


def test_reward_model_settings_are_checked():
    with pytest.raises(ValueError, match="reward_model.timeout_s must be > 0"):
        _check(config(timeout_s=0))
    with pytest.raises(ValueError, match="reward_model.num_workers must be >= 0"):
        _check(config(num_workers=-1))
    cfg = config("naive")
    cfg.reward_model.overlong_buffer.enable = True
    cfg.reward_model.overlong_buffer.len = 16
    with pytest.raises(ValueError, match="overlong_buffer.enable=True needs reward_model.reward_manager=dapo"):
        _check(cfg)
    cfg.reward_model.reward_manager = "dapo"
    cfg.data.max_response_length = 8
    with pytest.raises(ValueError, match="len=16 must not exceed data.max_response_length=8"):
        _check(cfg)
    cfg.data.max_response_length = 64
    _check(cfg)
    check_reward_config(cfg.reward_model, cfg.custom_reward_function)  # the two-argument call also works


def test_unused_reward_model_kwargs_are_reported(caplog):
    cfg = config()
    cfg.reward_model.reward_kwargs = {"x": 1}
    with caplog.at_level("WARNING"):
        _check(cfg)
    assert "custom_reward_function.reward_kwargs" in caplog.text
