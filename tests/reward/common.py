"""Batches of responses for reward-manager tests, and a file of user reward functions good and bad."""

from __future__ import annotations

import textwrap

import torch

from npu_rl.config.schema import PPOConfig
from npu_rl.data.dataset import object_array
from npu_rl.protocol import Batch

CUSTOM_FUNCTIONS = textwrap.dedent('''
    import math
    import time


    def exact(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        correct = solution_str.strip() == str(ground_truth)
        return {"score": float(correct) + bonus, "acc": float(correct), "seen_index": extra_info.get("index")}


    def as_float(data_source, solution_str, ground_truth, extra_info=None):
        return 0.25


    def calls_default(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        from npu_rl.reward import default_compute_score
        return default_compute_score(data_source, solution_str, ground_truth, extra_info)["score"] * 2


    def raises(data_source, solution_str, ground_truth, extra_info=None):
        if "boom" in solution_str:
            raise KeyError("no such thing")
        return 1.0


    def returns_nan(data_source, solution_str, ground_truth, extra_info=None):
        return math.nan


    def returns_huge(data_source, solution_str, ground_truth, extra_info=None):
        return 1e308  # finite in Python, inf in the float32 score tensor


    def returns_3e38(data_source, solution_str, ground_truth, extra_info=None):
        return 3e38  # float32 holds it, but a sum of two or its square (the group std) does not


    def returns_str(data_source, solution_str, ground_truth, extra_info=None):
        return "1.0"


    def returns_none(data_source, solution_str, ground_truth, extra_info=None):
        return None


    def dict_without_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"acc": 1.0}


    def hangs(data_source, solution_str, ground_truth, extra_info=None):
        if "hang" in solution_str:
            while True:
                time.sleep(0.01)
        return 1.0


    def hangs_swallowing_exceptions(data_source, solution_str, ground_truth, extra_info=None):
        while True:
            try:
                time.sleep(0.01)
            except Exception:
                pass


    def crashes(data_source, solution_str, ground_truth, extra_info=None):
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)


    def batch_exact(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
        return [float(s.strip() == str(g)) + bonus for s, g in zip(solution_strs, ground_truths)]


    def batch_wrong_length(data_sources, solution_strs, ground_truths, extra_infos):
        return [1.0]


    def wrong_signature(text, answer):
        return 1.0


    NOT_A_FUNCTION = 3
''')


def write_custom(tmp_path) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM_FUNCTIONS)
    return str(path)


def make_batch(tokenizer, texts, ground_truths, data_source="arith", width=16, eos=True, **non_tensors) -> Batch:
    """Right-padded responses [B, width] (EOS appended when ``eos`` and it fits) and their masks."""
    responses = torch.full((len(texts), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    for i, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])
        ids = ids[:width]
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    sources = data_source if isinstance(data_source, list) else [data_source] * len(texts)
    fields = {"data_source": sources, "ground_truth": list(ground_truths),
              "extra_info": object_array([{"index": i} for i in range(len(texts))]),
              "index": list(range(len(texts)))}
    fields.update(non_tensors)
    return Batch({"responses": responses, "response_mask": mask, "prompts": torch.zeros((len(texts), 3))}, fields)


def config(manager="naive", path=None, name="compute_score", **reward_model) -> PPOConfig:
    cfg = PPOConfig()
    cfg.reward_model.reward_manager = manager
    cfg.custom_reward_function.path = path
    cfg.custom_reward_function.name = name
    for key, value in reward_model.items():
        setattr(cfg.reward_model, key, value)
    return cfg
