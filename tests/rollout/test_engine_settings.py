"""vLLM engine settings per device (no vLLM needed), the device environment, and the factory's choices."""

from __future__ import annotations

import logging

import pytest

from npu_rl.config.schema import EngineKwargsConfig, RolloutConfig
from npu_rl.device.vllm_env import prepare_vllm_environment, task_queue_value, vllm_device_capabilities
from npu_rl.rollout import build_rollout_engine
from npu_rl.rollout.hf import HFRolloutEngine
from npu_rl.rollout.vllm_engine import build_llm_kwargs, default_capture_sizes

NPU = vllm_device_capabilities("npu")
CPU = vllm_device_capabilities("cpu")


def config(**overrides) -> RolloutConfig:
    base = dict(tensor_model_parallel_size=1, prompt_length=64, response_length=32)
    return RolloutConfig(**(base | overrides))


def test_graph_mode_is_full_decode_only_by_default_on_accelerators():
    kwargs = build_llm_kwargs(config(max_num_seqs=48), "/m", NPU)
    assert kwargs["enforce_eager"] is False
    assert kwargs["compilation_config"] == {"cudagraph_mode": "FULL_DECODE_ONLY",
                                           "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 48]}
    assert kwargs["enable_sleep_mode"] is True and kwargs["max_model_len"] == 96
    # vllm-ascend's sampler ignores logprobs_mode (returns raw): ask for raw and the top-K, converted on our side
    assert kwargs["distributed_executor_backend"] == "uni" and kwargs["logprobs_mode"] == "raw_logprobs"
    assert kwargs["max_logprobs"] == 20
    sizes = build_llm_kwargs(config(cudagraph_capture_sizes=[64, 8, 16]), "/m", NPU)["compilation_config"]
    assert sizes["cudagraph_capture_sizes"] == [8, 16, 64]
    assert "compilation_config" not in build_llm_kwargs(config(enforce_eager=True), "/m", NPU)
    assert default_capture_sizes(1024)[-1] == 512


def test_cpu_forces_eager_and_has_no_sleep_mode(caplog):
    with caplog.at_level(logging.INFO, logger="npu_rl.rollout.vllm_engine"):
        kwargs = build_llm_kwargs(config(), "/m", CPU)
    assert kwargs["enforce_eager"] is True and "compilation_config" not in kwargs
    assert kwargs["enable_sleep_mode"] is False and kwargs["block_size"] == 32
    assert kwargs["logprobs_mode"] == "processed_logprobs" and "max_logprobs" not in kwargs
    assert "block_size" not in build_llm_kwargs(config(), "/m", NPU)  # vLLM's own default there
    assert "eager" in caplog.text


def test_engine_kwargs_win_and_merge_compilation_config():
    cfg = config(engine_kwargs=EngineKwargsConfig(vllm={"compilation_config": {"cudagraph_mode": "PIECEWISE"},
                                                        "swap_space": 0}))
    kwargs = build_llm_kwargs(cfg, "/m", NPU)
    assert kwargs["compilation_config"]["cudagraph_mode"] == "PIECEWISE"
    assert "cudagraph_capture_sizes" in kwargs["compilation_config"] and kwargs["swap_space"] == 0


def test_parallel_settings_and_errors():
    kwargs = build_llm_kwargs(config(tensor_model_parallel_size=2), "/m", NPU, world_size=4)
    assert kwargs["distributed_executor_backend"] == "external_launcher" and kwargs["tensor_parallel_size"] == 2
    with pytest.raises(ValueError, match="needs 2 worker processes"):
        build_llm_kwargs(config(tensor_model_parallel_size=2), "/m", NPU)
    with pytest.raises(ValueError, match="must divide"):
        build_llm_kwargs(config(tensor_model_parallel_size=3), "/m", NPU, world_size=4)
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        build_llm_kwargs(config(enable_chunked_prefill=False, max_num_batched_tokens=64), "/m", NPU)


def test_device_environment(monkeypatch):
    for key in ("TASK_QUEUE_ENABLE", "NPU_RL_TASK_QUEUE_ENABLE", "VLLM_CPU_KVCACHE_SPACE",
                "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.delenv(key, raising=False)
    assert (task_queue_value(True), task_queue_value(False)) == ("1", "2")
    import os

    prepare_vllm_environment(graph_mode=True, device="npu")
    assert os.environ["TASK_QUEUE_ENABLE"] == "1" and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    prepare_vllm_environment(graph_mode=False, device="npu")
    assert os.environ["TASK_QUEUE_ENABLE"] == "2"
    monkeypatch.setenv("NPU_RL_TASK_QUEUE_ENABLE", "0")
    prepare_vllm_environment(graph_mode=True, device="npu")
    assert os.environ["TASK_QUEUE_ENABLE"] == "0"
    prepare_vllm_environment(graph_mode=False, device="cpu")
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # a user's own value is kept
    prepare_vllm_environment(graph_mode=False, device="cpu")
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_factory_falls_back_to_hf_without_vllm(monkeypatch, caplog, tiny_model_dir_pad_is_eos):
    from npu_rl.models.loader import load_tokenizer

    monkeypatch.setattr("npu_rl.rollout.factory.vllm_available", lambda: False)
    tokenizer = load_tokenizer(tiny_model_dir_pad_is_eos)
    with caplog.at_level(logging.WARNING, logger="npu_rl.rollout.factory"):
        engine = build_rollout_engine(config(name="vllm"), tiny_model_dir_pad_is_eos, None, tokenizer)
    assert isinstance(engine, HFRolloutEngine) and engine.needs_weight_sync
    assert "pip install" in caplog.text and "vllm" in caplog.text
    with pytest.raises(ValueError, match="vllm, hf"):
        build_rollout_engine(config(name="sglang"), tiny_model_dir_pad_is_eos, None, tokenizer)
