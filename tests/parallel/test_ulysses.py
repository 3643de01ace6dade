"""Ulysses sequence parallelism (sp=2 on 2 gloo ranks) against sp=1, with remove-padding.

The log-probs use a *per-token* temperature that differs from token to token: verl #5957 broke Ulysses +
remove-padding on NPU by not slicing that tensor with the sequence; sliced wrongly (or not at all) it cannot match
the sp=1 result. Float32; log-probs and gradients atol=1e-5, rtol=1e-4 (the attention of one sequence is summed
in a different order once split over heads and ranks).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.parallel.common import full_grads, make_batch, tiny_model

TOL = dict(atol=1e-5, rtol=1e-4)


def per_token_temperature(mask: torch.Tensor) -> torch.Tensor:
    steps = torch.arange(mask.numel(), dtype=torch.float32).view(mask.shape)
    return 0.5 + (steps % 7) / 4  # 0.5 .. 2.0, changing every token


def packed_logprobs(model, input_ids, mask, sp_group=None):
    """The worker-side recipe of npu_rl.parallel.packing: every per-token tensor goes through inputs.slice."""
    from npu_rl.parallel import prepare_packed_inputs

    inputs = prepare_packed_inputs(input_ids, mask, sp_group=sp_group)
    labels = inputs.slice(torch.roll(input_ids, -1, dims=1))
    temperature = inputs.slice(per_token_temperature(mask), pad_value=1.0)
    with inputs.attention():
        logits = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids, use_cache=False).logits
    logprobs = F.log_softmax(logits.float() / temperature.unsqueeze(-1), dim=-1)
    return inputs.restore(logprobs.gather(-1, labels.unsqueeze(-1)).squeeze(-1))  # [B, T]


def loss_of(logprobs, mask):
    valid = (mask * torch.roll(mask, -1, dims=1)).bool()
    valid[:, -1] = False
    return -(logprobs * valid).sum() / valid.sum(), valid


def ulysses_job(kv_heads: int, rows: int, seq_len: int) -> dict:
    from npu_rl.parallel import FSDPSettings, apply_fsdp2, build_mesh, use_varlen_attention

    mesh = build_mesh(sp_size=2)  # dp=1, sp=2: both ranks hold the same rows, half of the tokens each
    model = apply_fsdp2(use_varlen_attention(tiny_model(kv_heads=kv_heads)), mesh, FSDPSettings())
    input_ids, mask = make_batch(rows=rows, seq_len=seq_len)
    logprobs = packed_logprobs(model, input_ids, mask, sp_group=mesh.sp_group)
    loss, _ = loss_of(logprobs, mask)
    loss.backward()
    return {"logprobs": logprobs.detach(), "grads": full_grads(model), "layout": mesh.dispatch_layout()}


def reference(kv_heads: int, rows: int, seq_len: int) -> dict:
    from npu_rl.parallel import use_varlen_attention

    model = use_varlen_attention(tiny_model(kv_heads=kv_heads))
    input_ids, mask = make_batch(rows=rows, seq_len=seq_len)
    logprobs = packed_logprobs(model, input_ids, mask)
    loss, valid = loss_of(logprobs, mask)
    loss.backward()
    return {"logprobs": logprobs.detach(), "grads": full_grads(model), "valid": valid}


@pytest.mark.dist
@pytest.mark.parametrize("kv_heads,rows,seq_len", [(2, 4, 12), (1, 3, 11)], ids=["kv2", "kv1_repeat_odd_total"])
def test_ulysses_sp2_equals_sp1(dist_pool2, kv_heads, rows, seq_len):
    # kv1: one KV head over sp=2 is repeated; 3 rows of 11 give an odd packed length, so the sp padding is used.
    ref = reference(kv_heads, rows, seq_len)
    results = dist_pool2.run(ulysses_job, kv_heads, rows, seq_len)
    assert [r["layout"].is_collector for r in results] == [True, False]
    for result in results:
        torch.testing.assert_close(result["logprobs"], ref["logprobs"], **TOL)
        for name, grad in ref["grads"].items():
            torch.testing.assert_close(result["grads"][name], grad, **TOL, msg=name)


def test_packed_logprobs_equal_padded_forward():
    from npu_rl.parallel import use_varlen_attention

    model = tiny_model()
    input_ids, mask = make_batch()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
    padded = F.log_softmax(logits / per_token_temperature(mask).unsqueeze(-1), -1)
    padded = padded.gather(-1, torch.roll(input_ids, -1, 1).unsqueeze(-1)).squeeze(-1)
    packed = packed_logprobs(use_varlen_attention(model), input_ids, mask)
    valid = mask.bool()
    torch.testing.assert_close(packed[valid], padded[valid], atol=1e-5, rtol=1e-5)
    assert (packed[~valid] == 0).all()


def test_slice_rejects_a_tensor_not_shaped_like_the_batch():
    from npu_rl.parallel import prepare_packed_inputs

    input_ids, mask = make_batch()
    inputs = prepare_packed_inputs(input_ids, mask)
    with pytest.raises(ValueError, match="expected \\[4, 12"):
        inputs.slice(torch.ones(1, int(mask.sum())))  # an already packed tensor: the #5957 mistake, caught


def test_kv_repeat_factor():
    from npu_rl.parallel import kv_repeat_factor

    assert kv_repeat_factor(num_heads=4, num_kv_heads=2, sp_size=2) == 1
    assert kv_repeat_factor(num_heads=8, num_kv_heads=2, sp_size=4) == 2
    with pytest.raises(ValueError, match="divide the number of attention heads"):
        kv_repeat_factor(num_heads=6, num_kv_heads=2, sp_size=4)
    with pytest.raises(ValueError, match="one must divide the other"):
        kv_repeat_factor(num_heads=12, num_kv_heads=4, sp_size=6)


def collectives_job() -> dict:
    import torch.distributed as dist

    from npu_rl.parallel import SequenceShard, all_to_all

    rank = dist.get_rank()
    # [B=1, S/sp=3, H=4, D=2], values tag (rank, position, head)
    x = torch.tensor([[[[100 * rank + 10 * s + h] * 2 for h in range(4)] for s in range(3)]], dtype=torch.float32)
    x.requires_grad_(True)
    heads = all_to_all(x, scatter_dim=2, gather_dim=1, group=dist.group.WORLD)  # -> [1, 6, 2, 2]
    back = all_to_all(heads, scatter_dim=1, gather_dim=2, group=dist.group.WORLD)
    (heads * torch.arange(heads.numel()).view(heads.shape)).sum().backward()
    shard = SequenceShard(total=5, group=dist.group.WORLD)
    full = torch.arange(5.0).view(1, 5)
    local = shard.shard(full, pad_value=-1)
    return {"heads": heads.detach(), "back": back.detach(), "x": x.detach(), "grad": x.grad, "local": local,
            "gathered": shard.gather(local)}


@pytest.mark.dist
def test_all_to_all_and_sequence_shard(dist_pool2):
    results = dist_pool2.run(collectives_job)
    for rank, out in enumerate(results):
        heads = out["heads"][0, :, :, 0]  # [6 positions, 2 local heads]
        expected = torch.tensor([[100 * r + 10 * s + h for h in (2 * rank, 2 * rank + 1)]
                                 for r in range(2) for s in range(3)], dtype=torch.float32)
        torch.testing.assert_close(heads, expected)
        torch.testing.assert_close(out["back"], out["x"])  # the reverse exchange restores the input
        assert out["local"].tolist() == [[0.0, 1.0, 2.0]] if rank == 0 else [[3.0, 4.0, -1.0]]
        assert out["gathered"].tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0]]
    # The gradient of sum(heads * w) w.r.t. x is w routed back: rank 0's x[0, s, h] sits at heads position
    # (0*3 + s) on rank h // 2, local head h % 2; w there = index in that rank's [1, 6, 2, 2] tensor.
    for rank, out in enumerate(results):
        for s in range(3):
            for h in range(4):
                w = ((rank * 3 + s) * 2 + h % 2) * 2
                assert out["grad"][0, s, h].tolist() == [w, w + 1]
