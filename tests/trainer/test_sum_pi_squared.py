"""``sum_v pi_v^2`` (verl's actor.calculate_sum_pi_squared, read by the optimal-token-baseline estimators): from the
swapped head, equal to the full model's tempered softmax, on the padded and the packed path."""

from __future__ import annotations

import pytest
import torch

from npu_rl.models.forward import LogprobOptions, packed_response_logprobs, response_logprobs
from npu_rl.parallel.attention import use_varlen_attention
from tests.helpers import make_tiny_model


def test_sum_pi_squared_matches_the_full_softmax():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 120, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding of the prompt
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    response_length, temperature = 4, 0.7
    model = make_tiny_model().eval()
    options = LogprobOptions(compute_entropy=True, compute_sum_pi_squared=True, chunk_rows=3)
    with torch.no_grad():
        lp, ent, spi = response_logprobs(model, ids, mask, pos, ids[:, -response_length:], temperature, options,
                                         return_sum_pi_squared=True)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    probs = torch.softmax(logits[:, -response_length - 1:-1] / temperature, dim=-1)  # position t predicts t + 1
    torch.testing.assert_close(spi, probs.square().sum(-1))
    targets = ids[:, -response_length:]
    torch.testing.assert_close(lp, probs.log().gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    assert ((spi > 0) & (spi <= 1)).all()

    packed = make_tiny_model().eval()
    packed.load_state_dict(model.state_dict())
    use_varlen_attention(packed)
    with torch.no_grad():
        _, _, spi_packed = packed_response_logprobs(packed, ids, mask, pos, targets, temperature, options,
                                                    return_sum_pi_squared=True)
    torch.testing.assert_close(spi_packed, spi)


def test_asking_without_computing_fails():
    model = make_tiny_model().eval()
    ids = torch.randint(3, 120, (1, 6))
    mask, pos = torch.ones_like(ids), torch.arange(6).unsqueeze(0)
    with pytest.raises(ValueError, match="compute_sum_pi_squared=True"):
        response_logprobs(model, ids, mask, pos, ids[:, -2:], 1.0, LogprobOptions(), return_sum_pi_squared=True)
