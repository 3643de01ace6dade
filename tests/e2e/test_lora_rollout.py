"""Rollout with a LoRA actor: the hf engine generates with the PEFT model itself; vLLM runs with LoRA enabled and
is handed the adapter as tensors after each update (with ``load_format=dummy`` the base is streamed once first), or,
with ``model.lora.merge=True``, runs without LoRA and is handed the merged weights. After an update, the rollout's
log-probs equal the actor's recomputed ones, as they do without LoRA (float32)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.rollout import vllm_available
from tests.models.lora.common import LORA, actor_batch, actor_config, actor_rollout_worker
from tests.rollout.conftest import make_prompts

VLLM = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.max_model_len=128",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864"]
needs_vllm = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]


@pytest.mark.parametrize("engine, load_format, merge", [
    ("hf", "auto", False), pytest.param("vllm", "dummy", False, marks=needs_vllm),
    pytest.param("vllm", "dummy", True, marks=needs_vllm)])
def test_rollout_logprobs_equal_the_actor_after_a_lora_update(engine, load_format, merge, eos_model_dir, tmp_path):
    config = actor_config(eos_model_dir, str(tmp_path), *LORA, "actor_rollout_ref.rollout.calculate_log_probs=True",
                          "actor_rollout_ref.rollout.free_cache_engine=False", "data.max_response_length=8",
                          f"actor_rollout_ref.rollout.load_format={load_format}", *(VLLM if engine == "vllm" else []),
                          f"actor_rollout_ref.model.lora.merge={merge}")
    worker = actor_rollout_worker(config)
    worker.init_model(total_training_steps=2)
    prompts = make_prompts(worker.tokenizer, chat=True)
    first = worker.generate_sequences(prompts)
    before = first.batch
    batch = actor_batch(response=8)
    worker.update_policy(batch)
    second = worker.generate_sequences(prompts)
    out = second.batch
    if engine == "vllm" and not merge:  # the base streamed once (dummy start), then the adapter alone after each update
        assert "timing_s/rollout_update_weights" in first.metrics and "timing_s/update_adapter" in first.metrics
        assert "timing_s/update_adapter" in second.metrics
        assert "timing_s/rollout_update_weights" not in second.metrics, second.metrics
        again = worker.generate_sequences(prompts).metrics  # nothing changed: no gather, no reload
        assert again.get("rollout/update_adapter_skipped") == 1.0 and "timing_s/update_adapter" not in again
    if merge:  # vLLM started without LoRA: the merged weights W + scale * B @ A after each update, like a full sync
        assert not worker.engine.takes_lora_tensors and worker.engine._lora_request is None
        for metrics in (first.metrics, second.metrics):
            assert "timing_s/rollout_update_weights" in metrics and "timing_s/update_adapter" not in metrics, metrics
        again = worker.generate_sequences(prompts).metrics
        assert again.get("rollout/update_weights_skipped") == 1.0, again
    mask = out["response_mask"].bool()
    actor = worker.compute_logprobs(out)["old_logprobs"]
    torch.testing.assert_close(out["rollout_logprobs"][mask], actor[mask], rtol=1e-5, atol=1e-5)
    # the update reached the engine: the same prompts now score differently under the old rollout
    assert not torch.allclose(worker.compute_logprobs(before)["old_logprobs"][before["response_mask"].bool()],
                              before["rollout_logprobs"][before["response_mask"].bool()], atol=1e-3)
