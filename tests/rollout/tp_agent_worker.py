"""One rank of the TP = 2 agent-loop test (launched by torchrun from tests/e2e/test_agent_tp.py): vLLM's
external_launcher on gloo, the turn-by-turn path agent loops use (``generate_token_lists``).

The ranks ask for different turns in different numbers: rank 0 makes three calls (3, 1 and 2 requests), rank 1 one
call (2 requests), then each calls ``finish_token_lists``, rank 1 while rank 0 still generates. Each rank must get
back exactly its own continuations, equal to the hf engine's (greedy), and neither may hang. Exits non-zero on any
mismatch.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def main(model_dir: str) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from npu_rl.models.loader import load_tokenizer
    from npu_rl.rollout import SamplingParams
    from tests.rollout.conftest import PROMPTS
    from tests.rollout.tp_worker import tp2_engines

    tokenizer = load_tokenizer(model_dir)
    engine, hf = tp2_engines(model_dir, tokenizer)
    sampling = SamplingParams(n=1, do_sample=False, max_new_tokens=12, stop_token_ids=[2], return_logprobs=True)
    texts = [tokenizer(t)["input_ids"] for t in PROMPTS]
    calls = [[texts[0:3], texts[3:4], texts[4:6]], [texts[6:8]]][rank]
    for lists in calls:
        budgets = [4 + len(ids) % 5 for ids in lists]
        got = engine.generate_token_lists(lists, budgets, sampling).completions
        expected = hf.generate_token_lists(lists, budgets, sampling).completions
        assert len(got) == len(lists), (rank, len(got), len(lists))
        for g, e in zip(got, expected):
            assert g.token_ids == e.token_ids, (rank, g.token_ids, e.token_ids)
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(e.logprobs), rtol=1e-4, atol=1e-4)
    joined = engine.finish_token_lists(sampling)
    assert joined == (2 if rank == 1 else 0), (rank, joined)  # rank 1 joined rank 0's last two calls
    print(f"rank {rank}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
