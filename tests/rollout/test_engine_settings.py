"""vLLM engine settings per device (no vLLM needed), the device environment, and the factory's choices."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from npu_rl.config.engine_schema import EngineKwargsConfig
from npu_rl.config.schema import RolloutConfig
from npu_rl.device.vllm_env import prepare_vllm_environment, vllm_device_capabilities
from npu_rl.rollout import build_rollout_engine
from npu_rl.rollout.hf import HFRolloutEngine
from npu_rl.rollout.vllm_engine import routed_experts_rows
from npu_rl.rollout.vllm_settings import build_llm_kwargs, default_capture_sizes

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
    with caplog.at_level(logging.INFO, logger="npu_rl.rollout.vllm_settings"):
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


def test_expert_parallel_size_turns_on_vllms_expert_parallelism_as_verl_does():
    """verl: ``enable_expert_parallel = expert_parallel_size > 1``, with EP = TP x DP (DP is 1 for our engines)."""
    cuda = vllm_device_capabilities("cuda")
    on = build_llm_kwargs(config(tensor_model_parallel_size=2, expert_parallel_size=2), "/m", cuda, world_size=4)
    assert on["enable_expert_parallel"] is True and on["tensor_parallel_size"] == 2
    assert "enable_expert_parallel" not in build_llm_kwargs(config(tensor_model_parallel_size=2), "/m", cuda,
                                                            world_size=2)
    # npu-rl's own switch says the same thing
    assert build_llm_kwargs(config(enable_expert_parallel=True), "/m", NPU)["enable_expert_parallel"] is True
    with pytest.raises(ValueError, match="expert_parallel_size=4 must be 1 or equal tensor_model_parallel_size=2"):
        build_llm_kwargs(config(tensor_model_parallel_size=2, expert_parallel_size=4), "/m", cuda, world_size=4)
    with pytest.raises(ValueError, match="not available on cpu"):
        build_llm_kwargs(config(tensor_model_parallel_size=2, expert_parallel_size=2), "/m", CPU, world_size=2)
    assert not CPU.expert_parallel and cuda.expert_parallel and NPU.expert_parallel


def test_expert_parallel_size_is_checked_with_the_config():
    assert not config(tensor_model_parallel_size=4, expert_parallel_size=4).check("r")
    assert not config(tensor_model_parallel_size=4, expert_parallel_size=1).check("r")
    (problem,) = config(tensor_model_parallel_size=4, expert_parallel_size=2).check("r")
    assert problem.startswith("r.expert_parallel_size=2 must be 1 or equal tensor_model_parallel_size x "
                              "data_parallel_size = 4 x 1")


def test_device_environment(monkeypatch):
    for key in ("TASK_QUEUE_ENABLE", "VLLM_ASCEND_ENABLE_NZ", "VLLM_CPU_KVCACHE_SPACE",
                "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.delenv(key, raising=False)
    import os

    prepare_vllm_environment(graph_mode=True, device="npu")
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and os.environ["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert "TASK_QUEUE_ENABLE" not in os.environ  # read by torch_npu at import: the launch script's job
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "1")  # a user's NZ with sleep mode on: wake_up would raise
    prepare_vllm_environment(graph_mode=True, device="npu")
    assert os.environ["VLLM_ASCEND_ENABLE_NZ"] == "0"
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "1")  # without sleep mode a user's choice is kept
    prepare_vllm_environment(graph_mode=True, device="npu", free_cache_engine=False)
    assert os.environ["VLLM_ASCEND_ENABLE_NZ"] == "1"
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


def test_ascend_engine_gets_nz_off_and_no_cpu_binding_through_additional_config(monkeypatch):
    """vllm-ascend >= 0.27.1rc1 no longer reads VLLM_ASCEND_ENABLE_NZ: the key is what keeps wake_up working."""
    monkeypatch.delenv("VLLM_ASCEND_ENABLE_NZ", raising=False)
    kwargs = build_llm_kwargs(config(), "/m", NPU)
    assert kwargs["additional_config"] == {"weight_nz_mode": 0, "enable_cpu_binding": False}
    assert "additional_config" not in build_llm_kwargs(config(), "/m", CPU)
    user = config(engine_kwargs=EngineKwargsConfig(vllm={"additional_config": {"enable_cpu_binding": True,
                                                                               "ascend_log_path": "/l"}}))
    assert build_llm_kwargs(user, "/m", NPU)["additional_config"] == {
        "weight_nz_mode": 0, "enable_cpu_binding": True, "ascend_log_path": "/l"}  # merged key by key
    nz_on = config(engine_kwargs=EngineKwargsConfig(vllm={"additional_config": {"weight_nz_mode": 1}}))
    with pytest.raises(ValueError, match="weight_nz_mode=1 with vLLM sleep mode"):
        build_llm_kwargs(nz_on, "/m", NPU)
    assert build_llm_kwargs(config(free_cache_engine=False, engine_kwargs=nz_on.engine_kwargs), "/m",
                            NPU)["additional_config"]["weight_nz_mode"] == 1  # no sleep: the user's choice
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "2")  # without sleep mode the old variable still chooses
    assert build_llm_kwargs(config(free_cache_engine=False), "/m", NPU)["additional_config"]["weight_nz_mode"] == 2
    assert build_llm_kwargs(config(), "/m", NPU)["additional_config"]["weight_nz_mode"] == 0


def test_effective_nz_mode_per_release():
    from npu_rl.device.npu_env import effective_weight_nz_mode as nz

    on, off = {"VLLM_ASCEND_ENABLE_NZ": "1"}, {"VLLM_ASCEND_ENABLE_NZ": "0"}
    assert nz(None, off, "0.30.0rc2") == 1  # the variable is gone: the default decides
    assert nz({"weight_nz_mode": 0}, on, "0.30.0rc2") == 0
    assert nz({"weight_nz_mode": 0}, on, "0.26.0rc1") == 0  # key first, variable as the fallback
    assert nz(None, off, "0.26.0rc1") == 0 and nz(None, {}, "0.23.0.post1") == 1
    assert nz({"weight_nz_mode": 0}, on, "0.13.0") == 1  # before 0.20.2rc1 the key is ignored
    assert nz({"weight_nz_mode": 0}, off, "0.13.0") == 0


def test_allocator_expandable_segments_follow_the_rollout(monkeypatch):
    """Off while the engine is awake, on for training (verl's switch), on NPU only; NPU_RL_EXPANDABLE_SEGMENTS=0
    leaves the allocator alone."""
    import types

    import torch

    from npu_rl.device.vllm_env import allocator_for_rollout

    calls = []
    fake = types.SimpleNamespace(memory=types.SimpleNamespace(_set_allocator_settings=calls.append))
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    monkeypatch.delenv("NPU_RL_EXPANDABLE_SEGMENTS", raising=False)
    assert allocator_for_rollout("npu", awake=True) and allocator_for_rollout("npu", awake=False)
    assert calls == ["expandable_segments:False", "expandable_segments:True"]
    assert not allocator_for_rollout("cpu", awake=True)
    monkeypatch.setenv("NPU_RL_EXPANDABLE_SEGMENTS", "0")
    assert not allocator_for_rollout("npu", awake=True) and len(calls) == 2


def test_routing_capture_is_asked_for_and_laid_out_as_the_batch_pads():
    """R3 with vLLM: the engine is started with enable_return_routed_experts, and each completion's
    ``routed_experts`` [tokens, L, K] (prompt then response; the last sampled token never ran) lands in the batch's
    [rows, P + R, L, K] with prompts right-aligned in P and -1 wherever nothing was routed."""
    assert build_llm_kwargs(config(enable_rollout_routing_replay=True), "/m", NPU)["enable_return_routed_experts"]
    assert "enable_return_routed_experts" not in build_llm_kwargs(config(), "/m", NPU)
    layers, k = 2, 3
    a = np.arange(4 * layers * k).reshape(4, layers, k)   # prompt 2 + response 3, the last token missing
    b = np.arange(5 * layers * k).reshape(5, layers, k) + 100  # prompt 3 + response 2, every token
    out = routed_experts_rows([a, b], prompt_lengths=[2, 3], response_lengths=[3, 2], prompt_width=4,
                              response_width=3)
    assert out.shape == (2, 7, layers, k) and out.dtype == torch.int16
    assert (out[0, :2] == -1).all() and torch.equal(out[0, 2:4], torch.as_tensor(a[:2], dtype=torch.int16))
    assert torch.equal(out[0, 4:6], torch.as_tensor(a[2:4], dtype=torch.int16)) and (out[0, 6] == -1).all()
    assert (out[1, :1] == -1).all() and torch.equal(out[1, 1:4], torch.as_tensor(b[:3], dtype=torch.int16))
    assert torch.equal(out[1, 4:6], torch.as_tensor(b[3:5], dtype=torch.int16)) and (out[1, 6] == -1).all()
    with pytest.raises(RuntimeError, match=r"completion 0 have shape \[2, 2, 3\]; expected \[4 or more"):
        routed_experts_rows([a[:2], b], [2, 3], [3, 2], 4, 3)
    with pytest.raises(RuntimeError, match="no routed experts for completion 1"):
        routed_experts_rows([a, None], [2, 3], [3, 2], 4, 3)


def test_images_need_the_tokenizer_and_limit_the_images_per_prompt():
    """A Qwen-VL model on vLLM: its multi-modal processor refuses skip_tokenizer_init; verl's rollout.limit_images
    becomes limit_mm_per_prompt.image, and no video is profiled. A text model ignores limit_images."""
    text = build_llm_kwargs(config(limit_images=3), "/m", CPU)
    assert text["skip_tokenizer_init"] is True and "limit_mm_per_prompt" not in text
    images = build_llm_kwargs(config(limit_images=3), "/m", CPU, images=True)
    assert images["skip_tokenizer_init"] is False and images["limit_mm_per_prompt"] == {"image": 3, "video": 0}
    assert build_llm_kwargs(config(), "/m", CPU, images=True)["limit_mm_per_prompt"] == {"video": 0}
    # vLLM's image normalisation buffers are no weights: a dummy start would leave them random
    assert build_llm_kwargs(config(load_format="dummy"), "/m", CPU, images=True)["load_format"] == "auto"
    assert build_llm_kwargs(config(load_format="dummy"), "/m", CPU)["load_format"] == "dummy"
    user = config(engine_kwargs=EngineKwargsConfig(vllm={"limit_mm_per_prompt": {"image": 5}}))
    assert build_llm_kwargs(user, "/m", CPU, images=True)["limit_mm_per_prompt"] == {"image": 5}  # theirs wins
