"""The packed (remove-padding) forward used by the workers: equal to the padded one, with and without gradient
checkpointing (the recomputed layers must attend in packed mode too: found on the H200, where the recomputation
ran without the packed layout and saved a different set of tensors)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.models.forward import LogprobOptions, packed_response_logprobs, response_logprobs
from npu_rl.parallel.attention import use_varlen_attention
from tests.helpers import make_tiny_model


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 120, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[1, -3:] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_equals_padded_with_gradients(checkpointing):
    ids, mask, pos = _inputs()
    response_length = 5
    padded, packed = make_tiny_model(), make_tiny_model()
    packed.load_state_dict(padded.state_dict())
    use_varlen_attention(packed)
    for model in (padded, packed):
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    options = LogprobOptions(compute_entropy=True)
    lp_a, ent_a = response_logprobs(padded, ids, mask, pos, ids[:, -response_length:], 0.8, options)
    lp_b, ent_b = packed_response_logprobs(packed, ids, mask, pos, ids[:, -response_length:], 0.8, options)
    valid = mask[:, -response_length:].bool()
    torch.testing.assert_close(lp_b[valid], lp_a[valid])
    torch.testing.assert_close(ent_b[valid], ent_a[valid])
    ((lp_a * valid).sum() + (ent_a * valid).sum()).backward()
    ((lp_b * valid).sum() + (ent_b * valid).sum()).backward()
    for (name, a), b in zip(padded.named_parameters(), packed.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
