"""Rollout with a LoRA actor: the hf engine generates with the PEFT model itself, vLLM gets the adapter merged
into the weights it is streamed. After an update, the rollout's log-probs equal the actor's recomputed ones, as
they do without LoRA (float32; tolerances of the non-LoRA parity tests)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.rollout import vllm_available
from tests.lora.common import LORA, actor_batch, actor_config, actor_rollout_worker
from tests.rollout.conftest import make_prompts

VLLM = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.load_format=auto", "actor_rollout_ref.rollout.max_model_len=128",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864"]


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(
    not vllm_available(), reason="vLLM is not installed")])])
def test_rollout_logprobs_equal_the_actor_after_a_lora_update(engine, eos_model_dir, tmp_path):
    config = actor_config(eos_model_dir, str(tmp_path), *LORA, "actor_rollout_ref.rollout.calculate_log_probs=True",
                          "actor_rollout_ref.rollout.free_cache_engine=False", "data.max_response_length=8",
                          *(VLLM if engine == "vllm" else []))
    worker = actor_rollout_worker(config)
    worker.init_model(total_training_steps=2)
    prompts = make_prompts(worker.tokenizer, chat=True)
    before = worker.generate_sequences(prompts).batch
    batch = actor_batch(response=8)
    worker.update_policy(batch)
    out = worker.generate_sequences(prompts).batch
    mask = out["response_mask"].bool()
    actor = worker.compute_logprobs(out)["old_logprobs"]
    torch.testing.assert_close(out["rollout_logprobs"][mask], actor[mask], rtol=1e-5, atol=1e-5)
    # the update reached the engine: the same prompts now score differently under the old rollout
    assert not torch.allclose(worker.compute_logprobs(before)["old_logprobs"][before["response_mask"].bool()],
                              before["rollout_logprobs"][before["response_mask"].bool()], atol=1e-3)
