"""Worker classes for the controller tests (module level, so Ray actors can import them)."""

from __future__ import annotations

import os
import time

import torch

from npu_rl.controller import Dispatch, DispatchLayout, register
from npu_rl.protocol import Batch


class EchoWorker:
    """Reports where it runs; ``sp_size`` > 1 groups consecutive ranks like a Ulysses group would."""

    def __init__(self, sp_size: int = 1):
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.sp_size = sp_size
        self.calls = 0
        self.first_draw = torch.rand(1).item()  # what the process's generator gave at build time

    def dispatch_layout(self) -> DispatchLayout:
        return DispatchLayout(self.rank // self.sp_size, self.world_size // self.sp_size, self.rank % self.sp_size == 0)

    @register(Dispatch.ALL)
    def whoami(self) -> dict:
        import torch.distributed as dist

        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {"pid": os.getpid(), "env": {k: os.environ.get(k) for k in keys},
                "dist": dist.is_initialized() and (dist.get_rank(), dist.get_world_size(), dist.get_backend())}

    @register(Dispatch.ALL)
    def drawn_at_build(self) -> float:
        return self.first_draw

    @register(Dispatch.ALL)
    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(Dispatch.DP_SPLIT)
    def scale(self, batch: Batch, factor: float = 2.0) -> Batch:
        self.calls += 1
        n = len(batch)
        return Batch({"y": batch["x"] * factor, "rank": torch.full((n,), self.rank)},
                     {"tag": [f"r{self.rank}"] * n})

    @register(Dispatch.DP_SPLIT, pad_rows=True)
    def scale_any_rows(self, batch: Batch, factor: float = 2.0) -> Batch:
        """``scale`` for any row count: rows that do not divide over the ranks are padded, the copies dropped."""
        return self.scale(batch, factor)

    @register(Dispatch.DP_SPLIT)
    def count(self, batch: Batch) -> dict:
        return {"rank": self.rank, "rows": len(batch), "first": int(batch["x"][0])}

    @register(Dispatch.DP_SPLIT, blocking=False)
    def slow_sum(self, batch: Batch, delay_s: float = 0.0) -> torch.Tensor:
        time.sleep(delay_s)
        return batch["x"].sum(dim=0, keepdim=True)

    @register(Dispatch.RANK0)
    def rank_zero(self) -> int:
        return self.rank

    @register(Dispatch.ALL)
    def num_calls(self) -> int:
        return self.calls

    def unregistered(self) -> None:
        """Not callable through a group."""


class CounterWorker:
    """A second role, for colocation tests."""

    def __init__(self, start: int = 0):
        self.value = start

    @register(Dispatch.ALL)
    def add(self, amount: int) -> int:
        self.value += amount
        return self.value

    @register(Dispatch.ALL)
    def pid(self) -> int:
        return os.getpid()


class TinyPolicyWorker:
    """A worker as the trainer writes them: its own mesh, an FSDP2 model with packed (and Ulysses) attention,
    and a DP_SPLIT method. Never imports Ray."""

    def __init__(self, sp_size: int = 1):
        from npu_rl.parallel import FSDPSettings, apply_fsdp2, build_mesh, use_varlen_attention
        from tests.parallel.common import tiny_model

        self.mesh = build_mesh(sp_size=sp_size)
        self.model = apply_fsdp2(use_varlen_attention(tiny_model()), self.mesh, FSDPSettings())

    def dispatch_layout(self) -> DispatchLayout:
        return self.mesh.dispatch_layout()

    @register(Dispatch.DP_SPLIT)
    def compute_log_prob(self, batch: Batch) -> Batch:
        from npu_rl.parallel import prepare_packed_inputs

        input_ids, mask = batch["input_ids"], batch["attention_mask"]
        inputs = prepare_packed_inputs(input_ids, mask, sp_group=self.mesh.sp_group)
        labels = inputs.slice(torch.roll(input_ids, -1, dims=1))
        with torch.no_grad(), inputs.attention():
            logits = self.model(input_ids=inputs.input_ids, position_ids=inputs.position_ids, use_cache=False).logits
            logprobs = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return Batch({"old_log_probs": inputs.restore(logprobs)})


class BrokenWorker:
    def __init__(self):
        raise RuntimeError("model folder not found (on purpose)")
