"""The planner's resident terms against what the engine really allocates, counted on a CPU run: a one-device
ModelRunner (fp32 master + bf16 compute copy) through one micro-batch's backward and one AdamW step. Exact: the
planner counts these bytes the way model_runner.py lays them out. (The sharded counterpart, FSDP2 shards on 2 gloo
ranks, is in tests/parallel/test_sharded_load.py.)"""

from __future__ import annotations

import torch

from npu_rl.config.engine_schema import FSDPConfig, MixedPrecisionConfig, OptimConfig
from npu_rl.plan.memory import ModelShape, RoleMemory, TrainSettings
from npu_rl.workers.engine import build_optimizer
from npu_rl.workers.model_runner import ModelRunner
from tests.parallel.common import make_batch, mean_nll, tiny_model


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is not None and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def test_one_device_resident_bytes_match_the_plan():
    model = tiny_model(layers=3)
    shape = ModelShape(64, 128, 3, 4, 2, 128, tied=True)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    runner = ModelRunner(model, FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bf16")), trainable=True)
    optimizer = build_optimizer(runner.model, OptimConfig(lr=1e-3))
    input_ids, mask = make_batch()
    mean_nll(runner.compute_model, input_ids, mask).backward()
    compute_grads = _bytes(p.grad for p in runner.compute_model.parameters())
    runner.grads_to_master()
    master_grads = _bytes(p.grad for p in runner.model.parameters())
    runner.optimizer_step(optimizer)
    weights = _bytes([*runner.model.parameters(), *runner.compute_model.parameters()])
    states = _bytes(v for s in optimizer.state.values() for k, v in s.items() if k != "step")
    role = RoleMemory(shape, TrainSettings(), trainable=True)
    assert weights == role.weights()  # fp32 master + bf16 copy
    assert states == role.optimizer()  # two fp32 AdamW states
    assert compute_grads + master_grads == role.grads()  # both exist at the end of the backward
