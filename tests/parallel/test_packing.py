"""Remove-padding: packing helpers, and the packed forward/backward against the padded one (float32).

Tolerance for model outputs and gradients: atol=1e-5, rtol=1e-5 (attention sums over fewer masked terms).
"""

from __future__ import annotations

import pytest
import torch

from npu_rl.parallel import pad_output, prepare_packed_inputs, unpad_input, use_varlen_attention
from npu_rl.parallel.attention import VarlenLayout, sdpa_varlen, set_varlen_kernel, varlen_attention
from tests.parallel.common import make_batch, mean_nll, tiny_model

TOL = dict(atol=1e-5, rtol=1e-5)


def test_unpad_by_hand():
    input_ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 0], [1, 0, 2, 3]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [1, 0, 1, 1]])  # left pad, right pad, a hole
    packed = unpad_input(input_ids, mask)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 1, 2, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 0, 1, 2, 0, 1, 2]]  # restart per sequence
    assert packed.cu_seqlens.tolist() == [0, 2, 5, 8] and packed.cu_seqlens.dtype == torch.int32
    assert packed.seqlens == [2, 3, 3] and packed.max_seqlen == 3
    hf_positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what HF uses for the padded forward
    assert packed.unpad(hf_positions).tolist() == packed.position_ids.tolist()
    restored = pad_output(packed.input_ids * 10, packed, pad_value=-1)
    assert restored.tolist() == [[-1, -1, 50, 60], [70, 80, 90, -1], [10, -1, 20, 30]]
    with pytest.raises(ValueError, match="expected 8 tokens"):
        packed.pad(torch.zeros(7))


def test_given_position_ids_are_kept():
    input_ids, mask = torch.tensor([[4, 5, 6]]), torch.ones(1, 3, dtype=torch.long)
    assert unpad_input(input_ids, mask, position_ids=torch.tensor([[3, 4, 5]])).position_ids.tolist() == [[3, 4, 5]]


def test_reference_kernel_equals_block_diagonal_mask():
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(9, 4, 8, generator=gen), torch.randn(9, 2, 8, generator=gen), torch.randn(9, 2, 8,
                                                                                                   generator=gen)
    seqlens = [4, 0, 5]
    out = sdpa_varlen(q, k, v, cu_seqlens=torch.tensor([0, 4, 4, 9]), seqlens=seqlens, max_seqlen=5, scale=0.3)
    segment = torch.repeat_interleave(torch.arange(3), torch.tensor(seqlens))
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(9, 9, dtype=torch.bool).tril()
    scores = torch.einsum("thd,shd->hts", q, k.repeat_interleave(2, dim=1)) * 0.3
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    expected = torch.einsum("hts,shd->thd", weights, v.repeat_interleave(2, dim=1))
    torch.testing.assert_close(out, expected, **TOL)


def test_packed_forward_and_backward_equal_padded():
    input_ids, mask = make_batch(rows=4, seq_len=12)
    padded_model, packed_model = tiny_model(), use_varlen_attention(tiny_model())
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    padded_logits = padded_model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
    inputs = prepare_packed_inputs(input_ids, mask)
    with inputs.attention():
        local = packed_model(input_ids=inputs.input_ids, position_ids=inputs.position_ids, use_cache=False).logits
    packed_logits = inputs.restore(local)
    valid = mask.bool()
    torch.testing.assert_close(packed_logits[valid], padded_logits[valid], **TOL)
    targets = inputs.slice(torch.roll(input_ids, -1, dims=1))
    keep = inputs.slice(mask * torch.roll(mask, -1, dims=1) * (torch.arange(12) < 11)).bool()
    nll = torch.nn.functional.cross_entropy(local[0], targets[0], reduction="none")
    (nll * keep[0]).sum().div(keep.sum()).backward()
    mean_nll(padded_model, input_ids, mask).backward()
    for (name, p), q in zip(packed_model.named_parameters(), padded_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=name)


def test_model_outside_the_context_is_plain_sdpa():
    input_ids, mask = make_batch()
    model = tiny_model()
    before = model(input_ids=input_ids, attention_mask=mask).logits
    after = use_varlen_attention(model)(input_ids=input_ids, attention_mask=mask).logits
    torch.testing.assert_close(after, before, atol=0, rtol=0)


def test_kernel_override_is_used():
    calls = []

    def kernel(q, k, v, **kwargs):
        calls.append(kwargs["seqlens"])
        return sdpa_varlen(q, k, v, **kwargs)

    model = use_varlen_attention(tiny_model(layers=1))
    set_varlen_kernel(kernel)
    try:
        layout = VarlenLayout(torch.tensor([0, 2, 5], dtype=torch.int32), [2, 3], 3)
        with varlen_attention(layout):
            model(input_ids=torch.arange(3, 8).view(1, 5), position_ids=torch.tensor([[0, 1, 0, 1, 2]]))
    finally:
        set_varlen_kernel(None)
    assert calls == [[2, 3]]
