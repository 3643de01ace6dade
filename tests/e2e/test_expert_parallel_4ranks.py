"""Expert parallelism on 4 gloo processes (EP=2 with the expert blocks FSDP-sharded over 2 ranks, and EP=4); the 2-rank
parity tests are in tests/parallel/test_expert_parallel.py."""

from __future__ import annotations

import pytest
import torch

from tests.parallel.test_expert_parallel import (  # noqa: F401 (dist_pool4 is a fixture)
    TOL,
    dist_pool4,
    ep_train_job4,
    full_grads,
    make_batch,
    quarter_loss,
    tiny_moe,
)


@pytest.mark.parametrize("kind, ep_size", [("qwen3_moe", 2), ("deepseek_v3", 4)])
def test_four_ranks_ep_with_expert_fsdp(dist_pool4, kind, ep_size):  # noqa: F811
    """4 ranks: EP=2 leaves efsdp=2 (each expert block FSDP-sharded over the 2 ranks that hold it, along dim 1),
    EP=4 leaves efsdp=1. Gradients, the clipped norm and one clipped SGD step equal one process (SGD: AdamW's first
    step is ~lr * sign(grad), which turns the float noise of gradients near 0 into +-lr differences)."""
    model = tiny_moe(kind)
    input_ids, mask = make_batch()
    quarter_loss(model, input_ids, mask, 0, 1).backward()
    grads = full_grads(model)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    results = dist_pool4.run(ep_train_job4, kind, ep_size)
    # gate_up_proj [8, 32, 32]: 8/ep experts per rank, their 2I = 32 rows cut over efsdp
    assert {r["local_shape"] for r in results} == {(8 // ep_size, 32 // (4 // ep_size), 32)}
    assert {r["efsdp"] for r in results} == {4 // ep_size}
    for result in results:
        assert result["grads"].keys() == grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(result["grads"][name], grad, **TOL, msg=name)
        torch.testing.assert_close(result["norm"], norm, **TOL)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(result["params"][name], value, **TOL, msg=name)
