"""Compiled MoE experts (``actor.use_torch_compile``, forced on CPU with inductor's C++ backend): tiny Qwen3-MoE and
DeepSeek-V3 models give the eager models' logits and gradients (fp32, 1e-5 relative), batches of two other lengths
compile nothing new and break no graph (torch._dynamo's counters), and an MoE actor's update (checkpointing, the
auxiliary loss, router metrics) reports the same loss and gradient norm compiled as eager."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A fresh interpreter, as tests/e2e/test_compile_blocks.py: an msprobe dump earlier in a session refuses TorchDynamo.
_MODELS = """
import copy, sys, torch
from torch._dynamo.utils import counters
from npu_rl.models.compiled_experts import compile_experts
from tests.models.moe_models import tiny_moe

def relative(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))

eager = tiny_moe(sys.argv[1])
compiled = copy.deepcopy(eager)
assert eager.config._experts_implementation == "grouped_mm"
assert compile_experts(compiled) == 2  # qwen3_moe: 2 MoE layers; deepseek_v3: 3 layers, the first dense
graphs = []
for length in (10, 17, 23):
    counters.clear()
    ids = torch.randint(3, 100, (2, length), generator=torch.Generator().manual_seed(length))
    out_c, out_e = compiled(ids).logits, eager(ids).logits
    assert relative(out_c, out_e) <= 1e-5, relative(out_c, out_e)
    (out_c ** 2).mean().backward()
    (out_e ** 2).mean().backward()
    checked = 0
    for (name, p_c), p_e in zip(compiled.named_parameters(), eager.parameters()):
        if p_e.grad is not None and p_e.grad.abs().max() > 0:
            assert relative(p_c.grad, p_e.grad) <= 1e-5, (name, relative(p_c.grad, p_e.grad))
            checked += "experts" in name
    assert checked >= 4  # gate_up_proj and down_proj of both MoE layers
    compiled.zero_grad(), eager.zero_grad()
    assert not counters["graph_break"], dict(counters["graph_break"])
    graphs.append(counters["stats"]["unique_graphs"])
# the first length compiles (forward and backward of one frame, every layer's module running the same code);
# the other lengths compile nothing
assert graphs[0] >= 1 and graphs[1:] == [0, 0], graphs
print("OK", graphs)
"""

_ACTOR = """
import pathlib, tempfile
from tests.models.moe_models import save_tiny_moe
from tests.models.lora.common import actor_batch, actor_config, actor_worker

tmp = pathlib.Path(tempfile.mkdtemp())
folder = save_tiny_moe(str(tmp / "model"), "qwen3_moe")
results = []
for compiled in (False, True):
    worker = actor_worker(actor_config(folder, str(tmp / f"out{compiled}"), "actor_rollout_ref.actor.use_kl_loss=False",
        f"actor_rollout_ref.actor.use_torch_compile={compiled}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "+actor_rollout_ref.model.override_config.output_router_logits=True"))
    worker.init_model(total_training_steps=2)
    assert (worker.engine.runner.compiled_blocks > 0) == compiled
    first = worker.update_policy(actor_batch()).metrics
    second = worker.update_policy(actor_batch(rows=8, prompt=9, response=6, seed=1)).metrics
    results.append([m[k] for m in (first, second) for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe/aux_loss")])
for eager, compiled in zip(*results):
    assert abs(compiled - eager) <= 1e-5 * max(abs(eager), 1e-6), (eager, compiled)
print("OK", results)
"""


def _run(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
           "NPU_RL_COMPILE_BLOCKS": "1"}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("kind", ["qwen3_moe", "deepseek_v3"])
def test_compiled_experts_equal_eager_and_do_not_recompile_for_other_lengths(kind):
    _run(_MODELS, kind)


def test_an_moe_actors_update_is_the_same_compiled():
    _run(_ACTOR)
