"""The top-k log-probs of the swapped output layer (on-policy distillation's ``forward_kl_topk``): the teacher's own
top-k, and the student's log-probs at given ids with their gradient, equal to a full log-softmax of the model's
logits, on the padded and the packed forward."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from npu_rl.models.forward import LogprobOptions, packed_response_logprobs, response_logprobs
from npu_rl.parallel.attention import use_varlen_attention
from tests.helpers import make_tiny_model

R, K, TEMP = 5, 4, 0.8


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 120, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[1, -3:] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _full_logprobs(model, ids, mask, pos):
    """log softmax(logits / T) [B, R, V] at the positions that predict the response tokens."""
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    return torch.log_softmax(logits[:, -R - 1:-1] / TEMP, -1)


@pytest.mark.parametrize("packed", [False, True])
def test_topk_and_gathered_logprobs_equal_the_full_softmax(packed):
    ids, mask, pos = _inputs()
    model = make_tiny_model()
    if packed:
        use_varlen_attention(model)
    forward = packed_response_logprobs if packed else response_logprobs
    valid = mask[:, -R:].bool()
    full = _full_logprobs(make_tiny_model(), ids, mask, pos) if packed else _full_logprobs(model, ids, mask, pos)
    want_lp, want_ids = torch.topk(full, K, dim=-1)

    # the teacher's side: its own top-k
    lp, _, top_lp, top_ids = forward(model, ids, mask, pos, ids[:, -R:], TEMP, LogprobOptions(topk=K))
    assert top_lp.shape == top_ids.shape == (3, R, K) and top_ids.dtype == torch.long
    assert torch.equal(top_ids[valid], want_ids[valid])
    assert_close(top_lp[valid], want_lp[valid])
    assert_close(lp[valid], full.gather(-1, ids[:, -R:, None])[..., 0][valid])

    # the student's side: the log-probs at other ids (reversed top-k, shifted), with gradient
    other = (want_ids.flip(-1) + 1) % full.shape[-1]
    model.zero_grad()
    _, _, at, own = forward(model, ids, mask, pos, ids[:, -R:], TEMP, LogprobOptions(topk=K), topk_ids=other)
    assert torch.equal(own[valid], want_ids[valid])
    assert_close(at[valid], full.gather(-1, other)[valid])
    (at[valid].sum()).backward()
    reference = make_tiny_model()
    _full_logprobs(reference, ids, mask, pos).gather(-1, other)[valid].sum().backward()
    for (name, a), b in zip(reference.named_parameters(), model.parameters()):
        assert_close(b.grad, a.grad, msg=name, atol=1e-5, rtol=1e-4)


def test_topk_is_refused_with_the_fused_kernels():
    ids, mask, pos = _inputs()
    with pytest.raises(ValueError, match="use_fused_kernels=False"):
        response_logprobs(make_tiny_model(), ids, mask, pos, ids[:, -R:], TEMP,
                          LogprobOptions(topk=K, use_fused_kernels=True))
