"""MoE experts on Ascend (npu_rl/device/npu_experts.py), on CPU: a stand-in torch_npu computes what torch_npu's
documentation says ``npu_grouped_matmul`` and ``npu_grouped_matmul_add_`` compute, accepting only the arguments the
real releases declare; the experts' outputs and gradients must equal transformers' eager experts (fp32). Whether
the real kernels match their documentation is not checked here (no NPU)."""

from __future__ import annotations

import re
import sys
import types

import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from npu_rl.device import npu_experts

# The two ops' declarations, copied from torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml of each wheel on PyPI
# (torch_npu 2.7.1, 2.10.0.post4, 2.14.0, manylinux x86_64), trimmed after the arguments we pass.
DECLARED = {
    "npu_grouped_matmul": {
        release: "Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, Tensor[]? offset=None, "
                 "Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, "
                 "Tensor? group_list=None, Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, "
                 "Tensor[]? activation_quant_offset=None, int? split_item=0, int? group_type=None, "
                 "int? group_list_type=0, int? act_type=0"
        for release in ("2.7.1", "2.10.0.post4", "2.14.0")},
    "npu_grouped_matmul_add_": {
        release: "Tensor(a!) self, Tensor x, Tensor weight, Tensor group_list, *, bool transpose_x=True, "
                 "bool transpose_weight=False, int group_type=2"
        for release in ("2.7.1", "2.10.0.post4", "2.14.0")},
}


def _names(declaration: str) -> tuple[list[str], set[str]]:
    positional, keywords, star = [], set(), False
    for part in (p.strip() for p in declaration.split(",")):
        if part == "*":
            star = True
            continue
        name = re.sub(r"=.*", "", part.split()[-1])
        (keywords.add(name) if star else positional.append(name))
    return positional, keywords


def _checked(op: str, args: tuple, kwargs: dict) -> None:
    for release, declaration in DECLARED[op].items():
        positional, keywords = _names(declaration)
        assert len(args) == len(positional), (op, release, len(args))
        assert set(kwargs) <= keywords, (op, release, set(kwargs) - keywords)


def _split(offsets: torch.Tensor) -> list[tuple[int, int]]:
    bounds = [0] + offsets.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


@pytest.fixture
def stand_in(monkeypatch):
    """torch_npu as documented: grouped along M with cumulative counts (y[rows e] = x[rows e] @ w[e]); grouped along K
    with the result added in place into an fp32 tensor (self[e] += x[rows e]^T @ weight[rows e])."""
    calls = []

    def npu_grouped_matmul(*args, **kwargs):
        _checked("npu_grouped_matmul", args, kwargs)
        (x,), (w,) = args
        assert (kwargs["split_item"], kwargs["group_type"], kwargs["group_list_type"]) == (3, 0, 0)
        offsets = kwargs["group_list"]
        assert offsets.dtype == torch.int64 and offsets.shape == (w.shape[0],)
        calls.append("gmm")
        return [torch.cat([x[a:b] @ w[e] for e, (a, b) in enumerate(_split(offsets))])]

    def npu_grouped_matmul_add_(*args, **kwargs):
        _checked("npu_grouped_matmul_add_", args, kwargs)
        out, x, weight, offsets = args
        assert out.dtype == torch.float32 and kwargs == {"transpose_x": True, "transpose_weight": False, "group_type": 2}
        calls.append("gmm_add")
        for e, (a, b) in enumerate(_split(offsets)):
            out[e] += x[a:b].T.float() @ weight[a:b].float()
        return out

    fake = types.ModuleType("torch_npu")
    fake.npu_grouped_matmul, fake.npu_grouped_matmul_add_ = npu_grouped_matmul, npu_grouped_matmul_add_
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(npu_experts, "on_npu", lambda tensor: True)
    installed, why = npu_experts.install()
    assert installed, why
    yield calls
    npu_experts.uninstall()


def _experts(kind: str):
    torch.manual_seed(0)
    if kind == "qwen3_moe":
        config = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                num_experts=8, num_experts_per_tok=2)
        model = Qwen3MoeForCausalLM(config)
    else:
        config = DeepseekV3Config(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                                  num_hidden_layers=1, first_k_dense_replace=0, num_attention_heads=2,
                                  num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
                                  topk_group=1, q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=4,
                                  qk_nope_head_dim=4, v_head_dim=4)
        model = DeepseekV3ForCausalLM(config)
    return model.model.layers[0].mlp.experts


def _run(experts, implementation: str, hidden, index, weights):
    experts.config._experts_implementation = implementation
    for p in experts.parameters():
        p.grad = None
    hidden = hidden.clone().requires_grad_(True)
    out = experts(hidden, index, weights)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), hidden.grad, {n: p.grad.clone() for n, p in experts.named_parameters()}


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3"])
def test_npu_grouped_experts_equal_the_eager_experts(stand_in, kind):
    experts = _experts(kind)
    tokens, k = 11, 2
    hidden = torch.randn(tokens, 16)
    index = torch.randint(0, 6, (tokens, k))  # experts 6 and 7 receive no token: empty groups
    index[:, 1] = (index[:, 0] + 1) % 6
    weights = torch.rand(tokens, k)
    expected = _run(experts, "eager", hidden, index, weights)
    assert ALL_EXPERTS_FUNCTIONS["grouped_mm"] is npu_experts.npu_grouped_mm_experts_forward
    got = _run(experts, "grouped_mm", hidden, index, weights)
    assert stand_in == ["gmm", "gmm", "gmm", "gmm_add", "gmm", "gmm_add"]  # 2 forward, 2 x (dx, dW) backward
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-6)
    for name in expected[2]:
        torch.testing.assert_close(got[2][name], expected[2][name], rtol=1e-5, atol=1e-6, msg=name)
    assert got[2]["gate_up_proj"][6:].abs().sum() == 0  # no token, no gradient


def test_off_an_npu_tensor_and_switched_off(monkeypatch, stand_in):
    experts = _experts("qwen3_moe")
    monkeypatch.setattr(npu_experts, "on_npu", lambda tensor: False)  # e.g. a CPU-offloaded reference model
    hidden, index, weights = torch.randn(5, 16), torch.randint(0, 8, (5, 2)), torch.rand(5, 2)
    expected = _run(experts, "eager", hidden, index, weights)[0]
    torch.testing.assert_close(_run(experts, "grouped_mm", hidden, index, weights)[0], expected)
    assert stand_in == []  # transformers' own grouped_mm ran
    npu_experts.uninstall()
    monkeypatch.setenv(npu_experts.ENV, "0")
    assert npu_experts.install() == (False, "NPU_RL_NPU_GROUPED_MM=0")
    assert ALL_EXPERTS_FUNCTIONS["grouped_mm"] is not npu_experts.npu_grouped_mm_experts_forward
