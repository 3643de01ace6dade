"""The NPU half of profiling on a stand-in torch_npu.profiler: verl's level / analysis / mstx reach torch_npu's own
arguments, and the trace path recorded is the folder torch_npu writes (``<worker_name>_<timestamp>_ascend_pt``)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import types

import pytest

from npu_rl.device import ascend_facts
from npu_rl.device import profiler_backend as dev


@pytest.fixture
def fake_profiler(monkeypatch):
    calls = {"mstx": []}
    prof = types.ModuleType("torch_npu.profiler")
    prof.ProfilerActivity = types.SimpleNamespace(CPU="cpu", NPU="npu")
    prof.ProfilerLevel = types.SimpleNamespace(**{name: f"L:{name}" for name in ascend_facts.TORCH_NPU_PROFILER["levels"]})

    def experimental(profiler_level="L:Level0", mstx=False):  # a subset of the real keywords
        return {"profiler_level": profiler_level, "mstx": mstx}

    def handler(dir_name=None, worker_name=None, analyse_flag=True, async_mode=False):
        calls["handler"] = {"dir_name": dir_name, "worker_name": worker_name, "analyse_flag": analyse_flag}

        def write(_):  # what the real handler leaves (ascend_facts.TORCH_NPU_PROFILER["trace_folder"])
            stamp = time.strftime("%Y%m%d%H%M%S") + "123"
            os.makedirs(os.path.join(dir_name, ascend_facts.TORCH_NPU_PROFILER["trace_folder"].format(worker_name,
                                                                                                     stamp)))
        return write

    @contextlib.contextmanager
    def profile(*, activities=None, on_trace_ready=None, record_shapes=False, profile_memory=False,
                with_stack=False, experimental_config=None):
        calls["profile"] = {"activities": activities, "record_shapes": record_shapes, "memory": profile_memory,
                            "experimental_config": experimental_config}
        yield
        on_trace_ready(None)

    prof._ExperimentalConfig, prof.tensorboard_trace_handler, prof.profile = experimental, handler, profile
    mstx = types.SimpleNamespace(range_start=lambda message, stream=None, domain="default":
                                 calls["mstx"].append(("start", message)) or 7,
                                 range_end=lambda range_id, domain="default": calls["mstx"].append(("end", range_id)))
    torch_npu = types.ModuleType("torch_npu")
    torch_npu.profiler, torch_npu.npu = prof, types.SimpleNamespace(mstx=mstx)
    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
    monkeypatch.setitem(sys.modules, "torch_npu.profiler", prof)
    return calls


def test_level_analysis_and_mstx_reach_torch_npu(fake_profiler, tmp_path):
    out = str(tmp_path)
    with dev.trace_session("npu", out, "gen_rank0", ("shapes", "mstx"), level="level1", analysis=False):
        assert fake_profiler["mstx"] == [("start", "gen_rank0")]
    assert fake_profiler["mstx"] == [("start", "gen_rank0"), ("end", 7)]
    assert fake_profiler["profile"]["experimental_config"] == {"profiler_level": "L:Level1", "mstx": True}
    assert fake_profiler["profile"]["record_shapes"] and fake_profiler["profile"]["activities"] == ["cpu", "npu"]
    assert fake_profiler["handler"] == {"dir_name": out, "worker_name": "gen_rank0", "analyse_flag": False}
    path = dev.trace_path("npu", out, "gen_rank0")
    assert path and path.endswith("_ascend_pt") and os.path.basename(path).startswith("gen_rank0_")
    assert dev.trace_path("npu", out, "old_log_prob_rank0") is None


def test_defaults_and_a_bad_level(fake_profiler, tmp_path):
    with dev.trace_session("npu", str(tmp_path), "update_actor_rank0"):
        pass
    assert fake_profiler["profile"]["experimental_config"] == {"profiler_level": "L:Level0", "mstx": False}
    assert fake_profiler["mstx"] == [] and fake_profiler["handler"]["analyse_flag"] is True
    with pytest.raises(ValueError, match="level='level3': expected one of level0, level1, level2, level_none"):
        dev.trace_session("npu", str(tmp_path), "x", level="level3")


def test_cpu_trace_path(tmp_path):
    assert dev.trace_path("cpu", str(tmp_path), "gen_rank0") is None
    (tmp_path / "gen_rank0.pt.trace.json").write_text("{}")
    assert dev.trace_path("cpu", str(tmp_path), "gen_rank0") == str(tmp_path / "gen_rank0.pt.trace.json")
