"""One rank of the TP = 2 test with images (launched by torchrun from tests/e2e/test_vl_vllm.py): vLLM's
external_launcher on gloo, a tiny Qwen2.5-VL. Rank 0 and rank 1 pass different prompts (with images: the TP group
gathers the requests with their images); each must get back exactly its own rows, equal to the hf engine's, before
and after a weight sync. Exits non-zero on any mismatch."""

from __future__ import annotations

import pathlib
import sys

import torch
import torch.distributed as dist


def main(model_dir: str, other_dir: str, data_dir: str) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from npu_rl.config.engine_schema import EngineKwargsConfig
    from npu_rl.config.schema import RolloutConfig
    from npu_rl.models.loader import load_causal_lm
    from npu_rl.rollout import SamplingParams, build_rollout_engine
    from npu_rl.rollout.hf import HFRolloutEngine
    from tests.e2e.test_vl_vllm import _prompts

    folder = pathlib.Path(data_dir) / f"rank{rank}"
    folder.mkdir(parents=True, exist_ok=True)
    prompts, tokenizer = _prompts(model_dir, folder)
    prompts = prompts.index([0, 2] if rank == 0 else [1, 2, 0])
    config = RolloutConfig(name="vllm", dtype="float32", tensor_model_parallel_size=2, load_format="auto",
                           max_model_len=256, calculate_log_probs=True, limit_images=2,
                           engine_kwargs=EngineKwargsConfig(vllm={"kv_cache_memory_bytes": 64 << 20}))
    engine = build_rollout_engine(config, model_dir, None, tokenizer)
    hf = HFRolloutEngine(load_causal_lm(model_dir), tokenizer.pad_token_id)
    sampling = SamplingParams(n=2, do_sample=False, max_new_tokens=8, stop_token_ids=[tokenizer.eos_token_id],
                              return_logprobs=True)
    for step in range(2):
        out, expected = engine.generate(prompts, sampling).batch, hf.generate(prompts, sampling).batch
        assert len(out) == len(prompts) * 2, (rank, len(out))
        assert torch.equal(out["responses"], expected["responses"]), (rank, step)
        mask = out["response_mask"].bool()
        torch.testing.assert_close(out["rollout_logprobs"][mask], expected["rollout_logprobs"][mask], rtol=1e-4,
                                   atol=1e-4)
        new_weights = load_causal_lm(other_dir).state_dict()
        engine.update_weights(iter(new_weights.items()), version=step + 1)
        hf.module.load_state_dict(new_weights)
    print(f"rank {rank}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
