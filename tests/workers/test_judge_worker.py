"""The judge's server: the hf rollout engine on the judge's folder, one batched call; greedy texts equal
transformers' own greedy generate of the chat-templated prompts."""

from __future__ import annotations

import torch

from npu_rl.config.loader import load_config
from npu_rl.trainer.preflight import run_settings_for
from npu_rl.workers.roles import worker_specs
from tests.trainer.conftest import base_overrides


def test_greedy_judge_texts_equal_transformers_generate(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers import save_tiny_model_dir

    judge = save_tiny_model_dir(str(tmp_path / "judge"), seed=3)
    config = load_config(base_overrides(tiny_model_dir, str(tmp_path / "run")) + [
        "preset=grpo", "reward_model.enable=True", f"reward_model.model.path={judge}",
        "reward_model.rollout.dtype=fp32", "reward_model.rollout.do_sample=False",
        "reward_model.rollout.response_length=12"])
    settings = run_settings_for(config)
    specs = worker_specs(config, settings)
    assert "judge" in specs and "reward_model" not in specs
    worker = specs["judge"].cls(*specs["judge"].args)
    worker.init_model()
    prompts = ["Grade: 2+2=4", "Grade this longer response: 5+7=13, so the answer is 13"]
    texts = worker.generate_texts(prompts)
    tok = AutoTokenizer.from_pretrained(judge)
    model = AutoModelForCausalLM.from_pretrained(judge).eval()
    for prompt, text in zip(prompts, texts):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        assert text == tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert worker.engine is not None
