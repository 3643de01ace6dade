"""The one-device fp32 master copy: gradients of several micro-batches accumulate in fp32 (foreach path), and the
updated master weights reach the bf16 compute copy."""

from __future__ import annotations

import copy

import torch

from npu_rl.config.engine_schema import FSDPConfig, MixedPrecisionConfig

from npu_rl.workers.model_runner import ModelRunner, cast_copy
from tests.parallel.common import make_batch, mean_nll, tiny_model


def _fsdp_config():
    return FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bf16", reduce_dtype="fp32"))


def test_grads_accumulate_in_fp32_and_weights_flow_back():
    runner = ModelRunner(tiny_model(), _fsdp_config(), trainable=True)
    assert runner.has_master_copy and next(runner.compute_model.parameters()).dtype == torch.bfloat16
    expected = {}
    for seed in (1, 2):
        input_ids, mask = make_batch(seed=seed)
        mean_nll(runner.compute_model, input_ids, mask).backward()
        for name, p in runner.compute_model.named_parameters():
            if p.grad is not None:
                expected[name] = expected.get(name, 0) + p.grad.float()
        runner.grads_to_master()
        assert all(p.grad is None for p in runner.compute_model.parameters())
    for name, p in runner.model.named_parameters():
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, expected[name], msg=name)
    with torch.no_grad():
        for p in runner.model.parameters():
            p.add_(0.5)
    runner.master_to_compute()
    for master, compute in zip(runner.model.parameters(), runner.compute_model.parameters()):
        torch.testing.assert_close(compute, master.to(torch.bfloat16), atol=0, rtol=0)


def test_optimizer_implementation_is_the_device_layers_choice(monkeypatch):
    from npu_rl.device import make_backend

    monkeypatch.delenv("NPU_RL_OPTIMIZER_IMPL", raising=False)
    params = [torch.zeros(2)]
    assert make_backend("cpu").optimizer_kwargs(params) == {}
    assert make_backend("cuda").optimizer_kwargs(params) == {"fused": True}
    monkeypatch.setenv("NPU_RL_OPTIMIZER_IMPL", "foreach")
    assert make_backend("cpu").optimizer_kwargs(params) == {"foreach": True}
    monkeypatch.setenv("NPU_RL_OPTIMIZER_IMPL", "fast")
    import pytest

    with pytest.raises(ValueError, match="NPU_RL_OPTIMIZER_IMPL='fast'"):
        make_backend("cpu").optimizer_kwargs(params)


def test_the_compute_copy_is_the_deep_copy_cast_without_a_master_dtype_copy_first():
    model = tiny_model()
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's are
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)
    reference = copy.deepcopy(model).to(torch.bfloat16)  # what the runner built before
    fast = cast_copy(model, torch.bfloat16)
    assert fast.lm_head.weight is fast.model.embed_tokens.weight
    assert fast.lm_head.weight is not model.lm_head.weight
    for (name, a), (_, b) in zip(reference.named_parameters(), fast.named_parameters()):
        assert (a.dtype, a.requires_grad) == (b.dtype, b.requires_grad), name
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    for (name, a), (_, b) in zip(reference.named_buffers(), fast.named_buffers()):
        assert a.dtype == b.dtype, name  # rotary frequencies cast as .to() casts them
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)  # the copy owns its storage
    torch.testing.assert_close(fast.lm_head.weight, reference.lm_head.weight, atol=0, rtol=0)


def _peak_new_bytes(fn) -> int:
    """The most bytes ``fn`` holds at once beyond what it started with, on the CPU: the running sum of the
    profiler's allocations and frees (each op's own), in the order they happened."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    held = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        held += event.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


def test_accumulating_a_later_micro_batch_makes_no_master_dtype_copy_of_the_gradients():
    """The second micro-batch's bf16 gradients are added into the fp32 ones as they are: no fp32 copy of all of
    them at once (4 bytes a parameter on the device at the update's peak, npu_rl/plan/memory.py)."""
    runner = ModelRunner(tiny_model(), _fsdp_config(), trainable=True)
    params = sum(p.numel() for p in runner.model.parameters())
    largest = max(p.numel() for p in runner.model.parameters())
    for seed in (1, 2):
        input_ids, mask = make_batch(seed=seed)
        mean_nll(runner.compute_model, input_ids, mask).backward()
        peak = _peak_new_bytes(runner.grads_to_master)
    # at most one parameter's cast at a time (the old list of casts held params * 4 bytes)
    assert peak <= largest * 4 < params * 4 / 2, (peak, largest * 4, params * 4)
