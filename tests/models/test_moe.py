"""Router load, auxiliary loss and replay on transformers' own MoE layers (npu_rl/models/moe.py)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from npu_rl.models import moe
from tests.models.moe_models import tiny_moe


def test_expert_load_and_metrics_by_hand():
    # 3 tokens (the last is padding), 2 layers, top-2 of 4 experts
    indices = torch.tensor([[[0, 1], [2, 3]],
                            [[1, 2], [0, 1]],
                            [[0, 3], [2, 3]]])  # [N, L, K]
    mask = torch.tensor([1, 1, 0])
    counts = moe.expert_load(indices, mask, num_experts=4)
    # layer 0: e0 once, e1 twice, e2 once, e3 never (token 2 is padding); layer 1: e0..e3 once each
    torch.testing.assert_close(counts, torch.tensor([[1., 2., 1., 0.], [1., 1., 1., 1.]]))
    m = moe.load_metrics(counts, "x")
    # max over experts: 2 and 1 -> 1.5; mean over experts: 1 and 1; max/mean: 2 and 1 -> 1.5, worst 2; dead: 1 of 8
    torch.testing.assert_close(m["x/tokens_per_expert_max"], torch.tensor(1.5))
    torch.testing.assert_close(m["x/tokens_per_expert_mean"], torch.tensor(1.0))
    torch.testing.assert_close(m["x/max_over_mean"], torch.tensor(1.5))
    torch.testing.assert_close(m["x/max_over_mean_worst"], torch.tensor(2.0))
    torch.testing.assert_close(m["x/dead_expert_share"], torch.tensor(1 / 8))


def test_topk_mismatch_compares_sets_and_skips_unrecorded_tokens():
    recorded = torch.tensor([[[0, 1]], [[1, 2]], [[0, 3]], [[-1, -1]]])  # [N=4, L=1, K=2]
    computed = torch.tensor([[[1, 0]], [[1, 3]], [[0, 3]], [[5, 6]]])
    # token 0: same set in another order; token 1 differs; token 2 same; token 3 not recorded -> 1 of 3
    torch.testing.assert_close(moe.topk_mismatch(recorded, computed, torch.ones(4)), torch.tensor(1 / 3))
    # token 1 masked out -> 0 of 2
    torch.testing.assert_close(moe.topk_mismatch(recorded, computed, torch.tensor([1, 0, 1, 1])), torch.tensor(0.0))


def test_routers_found_in_layer_order_and_dense_models_have_none():
    from npu_rl.models.synthetic import random_causal_lm

    assert moe.routers(random_causal_lm("tiny")) == [] and moe.install_router_hooks(random_causal_lm("tiny")) is None
    qwen = tiny_moe("qwen3_moe")
    assert moe.routers(qwen) == [layer.mlp.gate for layer in qwen.model.layers]
    deepseek = tiny_moe("deepseek_v3")  # layer 0 is dense (first_k_dense_replace=1)
    assert moe.routers(deepseek) == [layer.mlp.gate for layer in deepseek.model.layers[1:]]


def test_aux_loss_is_the_models_own_with_padding_left_out():
    model = tiny_moe("qwen3_moe", output_router_logits=True).eval()
    hooks = moe.install_router_hooks(model)
    input_ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones(2, 7, dtype=torch.long)
    attention_mask[0, :3] = 0
    hooks.arm(capture=True)
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    ours = moe.aux_loss(model, hooks, attention_mask.reshape(-1))
    torch.testing.assert_close(ours, out.aux_loss)  # transformers' forward with output_router_logits=True
    expected = load_balancing_loss_func(out.router_logits, 8, 2, attention_mask)
    torch.testing.assert_close(ours, expected)
    assert moe.aux_loss_settings(model) == (True, 0.001)
    assert moe.aux_loss_settings(tiny_moe("deepseek_v3"))[0] is False  # no auxiliary loss: bias-balanced routing
    assert moe.aux_loss(tiny_moe("deepseek_v3"), hooks, attention_mask) is None


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3", "qwen2_moe", "mixtral"])
def test_replay_uses_recorded_experts_with_weights_from_current_logits(kind):
    model = tiny_moe(kind).eval()
    hooks = moe.install_router_hooks(model)
    router = hooks.modules[0]
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        natural_logits, _, natural = router(hidden)
    # replay experts the router did not choose: the natural second choice and one it ranked low
    recorded = torch.stack([natural[:, 0], (natural[:, 0] + 3) % 8], dim=-1)
    recorded[4] = -1  # not recorded: the router's own choice
    replay = recorded.unsqueeze(1).expand(5, hooks.num_layers, 2).contiguous()
    hooks.arm(capture=True, replay=replay)
    with torch.no_grad():
        logits, weights, indices = router(hidden)
    expected_idx = torch.where(recorded >= 0, recorded, natural)
    torch.testing.assert_close(indices, expected_idx)
    if kind in ("qwen3_moe", "mixtral"):  # softmax, top-k renormalised
        chosen = torch.softmax(logits.float(), dim=-1).gather(-1, expected_idx)
        expected = chosen / chosen.sum(-1, keepdim=True)
    elif kind == "qwen2_moe":  # softmax, not renormalised (norm_topk_prob=False, Qwen2-MoE's default)
        expected = torch.softmax(logits.float(), dim=-1).gather(-1, expected_idx)
    else:  # sigmoid, renormalised, times routed_scaling_factor (2.5); the correction bias only picks
        chosen = torch.sigmoid(logits.float()).gather(-1, expected_idx)
        expected = chosen / (chosen.sum(-1, keepdim=True) + 1e-20) * 2.5
    torch.testing.assert_close(weights.float(), expected)
    torch.testing.assert_close(hooks.records[0].natural, natural)  # what the router would have chosen
    hooks.clear()
    with torch.no_grad():
        torch.testing.assert_close(router(hidden)[2], natural)  # disarmed: the router's own choice again


def test_replay_refuses_a_recording_of_another_shape():
    hooks = moe.install_router_hooks(tiny_moe("qwen3_moe"))
    with pytest.raises(ValueError, match="2 routers with top_k=2"):
        hooks.arm(capture=False, replay=torch.zeros(4, 3, 2, dtype=torch.long))


def test_replay_gradient_reaches_the_router_through_recomputed_weights():
    model = tiny_moe("qwen3_moe")
    hooks = moe.install_router_hooks(model)
    input_ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(2))
    replay = torch.randint(0, 8, (6, 2, 1)).repeat(1, 1, 2)
    replay[..., 1] = (replay[..., 0] + 1) % 8
    hooks.arm(capture=True, replay=replay)
    model(input_ids=input_ids).logits.sum().backward()
    assert torch.equal(hooks.stacked_indices(), replay)
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in hooks.modules)


def test_correction_bias_update_by_hand():
    model = tiny_moe("deepseek_v3")
    routers = moe.routers(model)
    before = [r.e_score_correction_bias.clone() for r in routers]
    # layer 0: mean 3 -> experts 0, 1 overloaded (-0.01), 2, 3 at the mean (0), 4..7 underloaded (+0.01)
    # layer 1: all at the mean 2 -> unchanged
    counts = torch.tensor([[7., 5., 3., 3., 2., 2., 1., 1.],
                           [2., 2., 2., 2., 2., 2., 2., 2.]])
    moe.update_correction_bias([model], counts, rate=0.01)
    torch.testing.assert_close(routers[0].e_score_correction_bias - before[0],
                               torch.tensor([-0.01, -0.01, 0, 0, 0.01, 0.01, 0.01, 0.01]))
    torch.testing.assert_close(routers[1].e_score_correction_bias, before[1])
    assert moe.has_correction_bias(model) and not moe.has_correction_bias(tiny_moe("qwen3_moe"))
