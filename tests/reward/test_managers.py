"""Reward managers: where the score lands, the dapo overlong penalty by hand, errors, timeouts and the pool."""

from __future__ import annotations

import pickle

import pytest
import torch

from npu_rl.reward import build_reward_manager, overlong_penalty
from npu_rl.reward.managers import BatchRewardManager, DAPORewardManager, NaiveRewardManager
from npu_rl.reward.score_fn import RewardFunctionError
from tests.helpers import make_tiny_tokenizer
from tests.reward.common import config, make_batch, write_custom


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


@pytest.fixture
def custom(tmp_path):
    return write_custom(tmp_path)


def test_naive_puts_the_score_on_the_last_valid_token(tok):
    batch = make_batch(tok, ["2 + 3 = 5", "7", "4"], ["5", "7", "5"])
    manager = build_reward_manager(config(), tok)
    assert isinstance(manager, NaiveRewardManager)
    result = manager(batch)
    scores = result.token_level_scores
    assert scores.shape == (3, 16) and scores.dtype == torch.float32
    # "2 + 3 = 5" is 9 tokens + EOS: index 9; "7" + EOS: index 1
    expected = torch.zeros(3, 16)
    expected[0, 9], expected[1, 1] = 1.0, 1.0
    torch.testing.assert_close(scores, expected)
    assert list(result.extra["score"]) == [1.0, 1.0, 0.0] and list(result.extra["acc"]) == [1.0, 1.0, 0.0]
    assert list(result.extra["pred"]) == ["5", "7", "4"]
    assert result.metrics == {"reward/errors": 0.0, "reward/timeouts": 0.0}


def test_masks_with_holes_and_empty_responses(tok):
    batch = make_batch(tok, ["12", "x"], ["12", "1"], width=8)
    # row 0: "1", a masked-out tool token, "2", EOS -> decoded "12" from the masked-in tokens only
    batch["responses"][0, :4] = torch.tensor(tok("1#2", add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    batch["response_mask"][0, :4] = torch.tensor([1, 0, 1, 1])
    batch["response_mask"][1] = 0  # an empty response: scored on "", placed at position 0
    result = build_reward_manager(config(), tok)(batch)
    assert list(result.extra["pred"]) == ["12", ""]
    assert result.token_level_scores[0].tolist() == [0, 0, 0, 1.0, 0, 0, 0, 0]
    assert result.token_level_scores[1].abs().sum() == 0


def test_batch_manager_matches_naive_on_mixed_sources(tok):
    texts = ["#### 18", "so \\boxed{\\frac12}", "9", "Answer: 25", "#### 3"]
    gts = ["18", "\\frac{1}{2}", "8", "25", "4"]
    sources = ["openai/gsm8k", "HuggingFaceH4/MATH-500", "arith", "aime2024", "openai/gsm8k"]
    batch = make_batch(tok, texts, gts, data_source=sources, width=24)
    naive = build_reward_manager(config("naive"), tok)(batch)
    batched_manager = build_reward_manager(config("batch"), tok)
    assert isinstance(batched_manager, BatchRewardManager)
    batched = batched_manager(batch)
    torch.testing.assert_close(batched.token_level_scores, naive.token_level_scores)
    assert naive.token_level_scores.sum(-1).tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert list(batched.extra["acc"]) == list(naive.extra["acc"])


def test_overlong_penalty_by_hand():
    # max 20 tokens, buffer 4: no penalty up to 16 tokens, then -factor * (L - 16) / 4
    lengths = torch.tensor([10, 16, 17, 18, 20])
    torch.testing.assert_close(overlong_penalty(lengths, 20, 4, 1.0), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 20, 4, 0.5), torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5]))


def test_dapo_manager_adds_the_penalty(tok):
    # every response answers "5" (right), padded with spaces to L tokens including EOS
    lengths = [10, 16, 17, 18, 20]
    texts = ["5" + " " * (n - 2) for n in lengths]
    batch = make_batch(tok, texts, ["5"] * 5, width=20)
    assert batch["response_mask"].sum(-1).tolist() == lengths
    cfg = config("dapo")
    cfg.data.max_response_length = 20
    cfg.reward_model.overlong_buffer.enable = True
    cfg.reward_model.overlong_buffer.len = 4
    cfg.reward_model.overlong_buffer.penalty_factor = 1.0
    cfg.reward_model.overlong_buffer.log = True
    manager = build_reward_manager(cfg, tok)
    assert isinstance(manager, DAPORewardManager)
    result = manager(batch)
    torch.testing.assert_close(result.token_level_scores.sum(-1), torch.tensor([1.0, 1.0, 0.75, 0.5, 0.0]))
    assert [int(i) for i in result.token_level_scores[:4].argmax(-1)] == [n - 1 for n in lengths[:4]]
    assert result.token_level_scores[4].abs().sum() == 0  # 1 - 1: right but at the length limit
    assert list(result.extra["overlong_reward"]) == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert list(result.extra["overlong"]) == [False, False, True, True, True]
    assert list(result.extra["score"]) == [1.0] * 5  # the scorer's own score, before the penalty
    assert result.metrics["reward/overlong_ratio"] == pytest.approx(0.6)
    cfg.reward_model.overlong_buffer.enable = False  # off: dapo scores like naive
    torch.testing.assert_close(build_reward_manager(cfg, tok)(batch).token_level_scores.sum(-1), torch.ones(5))


@pytest.mark.parametrize("length, max_length, message", [(0, 20, "len must be > 0"), (30, 20, "must not exceed")])
def test_dapo_buffer_settings_are_checked(tok, length, max_length, message):
    cfg = config("dapo")
    cfg.data.max_response_length = max_length
    cfg.reward_model.overlong_buffer.enable = True
    cfg.reward_model.overlong_buffer.len = length
    with pytest.raises(ValueError, match=message):
        build_reward_manager(cfg, tok)


def test_reward_fn_key_picks_another_column(tok):
    batch = make_batch(tok, ["#### 5"], ["5"], data_source="unknown", source=["openai/gsm8k"])
    cfg = config()
    cfg.data.reward_fn_key = "source"
    assert build_reward_manager(cfg, tok)(batch).token_level_scores.sum() == 1.0


def test_custom_function_with_kwargs_and_float_results(tok, custom):
    batch = make_batch(tok, ["5", "6"], ["5", "5"])
    cfg = config(path=custom, name="exact")
    cfg.custom_reward_function.reward_kwargs = {"bonus": 0.5}
    result = build_reward_manager(cfg, tok)(batch)
    assert result.token_level_scores.sum(-1).tolist() == [1.5, 0.5]
    assert list(result.extra["seen_index"]) == [0, 1]  # extra_info reaches the function
    result = build_reward_manager(config(path=custom, name="as_float"), tok)(batch)
    assert list(result.extra["acc"]) == [0.25, 0.25]  # a bare float is logged as acc too (verl)
    result = build_reward_manager(config(path=custom, name="calls_default"), tok)(batch)
    assert result.token_level_scores.sum(-1).tolist() == [2.0, 0.0]
    cfg = config("batch", path=custom, name="batch_exact")
    cfg.custom_reward_function.reward_kwargs = {"bonus": 1.0}
    assert build_reward_manager(cfg, tok)(batch).token_level_scores.sum(-1).tolist() == [2.0, 1.0]


def test_default_scorer_kwargs_from_custom_reward_function(tok):
    batch = make_batch(tok, ["it is 18"], ["18"], data_source="openai/gsm8k")
    assert build_reward_manager(config(), tok)(batch).token_level_scores.sum() == 0.0  # strict: needs ####
    cfg = config()
    cfg.custom_reward_function.reward_kwargs = {"method": "flexible"}
    assert build_reward_manager(cfg, tok)(batch).token_level_scores.sum() == 1.0


@pytest.mark.parametrize("name, message", [
    ("raises", "KeyError: 'no such thing'"),
    ("returns_nan", "returned a non-finite score nan"),
    ("returns_huge", "returned the score 1e+308, beyond what the step can compute with"),
    ("returns_3e38", "returned the score 3e+38, beyond what the step can compute with"),  # issue 39: trained nothing
    ("returns_str", "returned a str"),
    ("returns_none", "returned a NoneType"),
    ("dict_without_score", "returned a dict without 'score'"),
])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_bad_results_fail_naming_function_and_row(tok, custom, name, message, num_workers):
    batch = make_batch(tok, ["ok", "boom"], ["1", "1"])
    manager = build_reward_manager(config(path=custom, name=name, num_workers=num_workers), tok)
    try:
        with pytest.raises(RewardFunctionError) as info:
            manager(batch)
    finally:
        manager.close()
    text = str(info.value)
    assert message in text and f"function {name!r} in {custom}" in text
    assert "row 0 of the batch" in text or "row 1 of the batch" in text
    assert "tolerate_errors" in text


def test_tolerated_errors_score_zero_and_are_counted(tok, custom, caplog):
    batch = make_batch(tok, ["ok", "boom", "ok"], ["1", "1", "1"])
    manager = build_reward_manager(config(path=custom, name="raises", tolerate_errors=True), tok)
    with caplog.at_level("WARNING"):
        result = manager(batch)
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert result.metrics == {"reward/errors": 1.0, "reward/timeouts": 0.0}
    assert "row 1 of the batch" in caplog.text and "KeyError" in caplog.text
    assert list(result.extra["acc"]) == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_hung_scorer_is_cut_by_the_timeout(tok, custom, num_workers):
    batch = make_batch(tok, ["ok", "hang", "ok"], ["1", "1", "1"])
    cfg = config(path=custom, name="hangs", num_workers=num_workers, timeout_s=0.5, tolerate_errors=True)
    manager = build_reward_manager(cfg, tok)
    try:
        result = manager(batch)
        assert result.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 1.0]
        assert result.metrics == {"reward/errors": 0.0, "reward/timeouts": 1.0}
        cfg.reward_model.tolerate_errors = False
        strict = build_reward_manager(cfg, tok)
        with pytest.raises(TimeoutError, match=r"took longer than reward_model.timeout_s=0.5 s on row 1 of the batch"):
            strict(batch)
        strict.close()
    finally:
        manager.close()


def test_the_pool_kills_what_an_alarm_cannot_stop_and_survives_a_crash(tok, custom):
    batch = make_batch(tok, ["a", "b"], ["1", "1"])
    cfg = config(path=custom, name="hangs_swallowing_exceptions", num_workers=2, timeout_s=0.5, tolerate_errors=True)
    manager = build_reward_manager(cfg, tok)
    try:
        assert manager(batch).metrics["reward/timeouts"] == 2.0
    finally:
        manager.close()
    manager = build_reward_manager(config(path=custom, name="crashes", num_workers=1, tolerate_errors=True), tok)
    try:
        result = manager(batch)
        assert result.metrics["reward/errors"] == 2.0  # each crash replaced the worker
    finally:
        manager.close()


def test_pool_and_in_process_agree_and_the_manager_pickles(tok, packaged_data_dir):
    texts = [f"#### {i}" for i in range(20)]
    batch = make_batch(tok, texts, [str(i % 3) for i in range(20)], data_source="openai/gsm8k")
    local = build_reward_manager(config(), tok)(batch)
    pooled = build_reward_manager(config(num_workers=2), tok)
    try:
        first = pooled(batch)
        torch.testing.assert_close(first.token_level_scores, local.token_level_scores)
        assert list(first.extra["pred"]) == list(local.extra["pred"])
        clone = pickle.loads(pickle.dumps(pooled))  # a running pool does not travel; the clone starts its own
        torch.testing.assert_close(clone(batch).token_level_scores, local.token_level_scores)
        clone.close()
    finally:
        pooled.close()


def test_missing_fields_and_unknown_sources_fail_even_when_tolerating(tok):
    manager = build_reward_manager(config(tolerate_errors=True), tok)
    batch = make_batch(tok, ["1"], ["1"])
    batch.pop("ground_truth")
    with pytest.raises(ValueError, match="no 'ground_truth' field"):
        manager(batch)
    with pytest.raises(ValueError, match="row 0 .* has no ground truth"):
        manager(make_batch(tok, ["1"], [None]))
    with pytest.raises(ValueError, match=r"no rule scorer for data_source \['somewhere/else'\]"):
        manager(make_batch(tok, ["1"], ["1"], data_source="somewhere/else"))


def test_extra_columns_stay_the_same_across_calls(tok, custom):
    manager = build_reward_manager(config(tolerate_errors=True), tok)
    first = manager(make_batch(tok, ["1"], ["1"]))
    assert set(first.extra) == {"score", "acc", "pred"}
    batch = make_batch(tok, ["1"], ["1"])
    manager._runner = type("Failing", (), {"run": lambda self, rows, *deadline_and_stop: [
        __import__("npu_rl.reward.pool", fromlist=["Outcome"]).Outcome("error", error="x")] * len(rows)})()
    second = manager(batch)  # every row failed: still the columns of the first call, for Batch.concat
    assert set(second.extra) == {"score", "acc", "pred"} and list(second.extra["pred"]) == [None]


def test_a_function_that_cannot_load_fails_in_the_pool_too(tok, custom):
    manager = build_reward_manager(config(path=custom, name="wrong_signature", num_workers=1), tok)
    with pytest.raises(RewardFunctionError, match=rf"loading function 'wrong_signature' in {custom} in a reward worker "
                                                  r"failed: .*Expected verl's signature"):
        manager(make_batch(tok, ["1"], ["1"]))
    manager.close()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_async_reward_function_scores_in_process_and_in_the_pool(tok, tmp_path, num_workers):
    """verl's reward loop awaits an ``async def compute_score`` (verl-recipe's FAPO baseline has one): each call is
    run to completion here, in the trainer's process and in a pool worker alike."""
    path = tmp_path / "async_reward.py"
    path.write_text("import asyncio\n"
                    "async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    loop = asyncio.get_running_loop()\n"
                    "    correct = await loop.run_in_executor(None, lambda: solution_str.strip() == ground_truth)\n"
                    "    return {'score': 1.0 if correct else -1.0, 'acc': correct}\n")
    batch = make_batch(tok, ["5", "4"], ["5", "5"])
    manager = build_reward_manager(config(path=str(path), num_workers=num_workers), tok)
    try:
        result = manager(batch)
    finally:
        manager.close()
    assert result.token_level_scores.sum(-1).tolist() == [1.0, -1.0]
    assert list(result.extra["acc"]) == [True, False] and result.metrics["reward/errors"] == 0.0
