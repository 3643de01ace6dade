"""The hf engine with images: a Qwen-VL module generates from ``pixel_values`` / ``image_grid_thw`` (repeated with
the samples) and the log-probs it records equal the actor's forward over the 3-D rotary ids the batch carries, so
rollout and training see the same positions, for Qwen2.5-VL and Qwen3-VL."""

import pytest
import torch
from PIL import Image

from npu_rl.data.images import image_bytes
from npu_rl.models.forward import response_logprobs
from npu_rl.models.loader import load_causal_lm
from npu_rl.models.lora import LoraSpec, apply_lora, lora_layers
from npu_rl.models.synthetic import VL_KINDS, save_random_vl_model
from npu_rl.models.vision import multi_modal_kwargs
from npu_rl.rollout import SamplingParams
from npu_rl.rollout.hf import HFRolloutEngine, vision_token_ids
from tests.rollout.vl_rows import image_prompt_batch


def _prompts(folder, tmp_path):
    png = [image_bytes(Image.new("RGB", size, colour)) for size, colour in [((50, 40), (200, 0, 0)),
                                                                              ((64, 64), (0, 0, 200))]]
    return image_prompt_batch(folder, tmp_path, png)


@pytest.mark.parametrize("kind", VL_KINDS)
@pytest.mark.parametrize("lora", [False, True])
def test_rollout_logprobs_equal_the_actor_forward(kind, lora, tmp_path):
    """``lora``: the module is a PEFT model (a LoRA actor's, the hf engine generates with it): its 3-D ids still come
    from transformers' rope index (found under the PEFT wrapper)."""
    folder = save_random_vl_model(str(tmp_path / kind), kind, seed=4)
    prompts, tokenizer = _prompts(folder, tmp_path)
    model = load_causal_lm(folder)
    if lora:
        model = apply_lora(model, LoraSpec(rank=4), seed=1)
        for _, layer in lora_layers(model):  # a trained adapter (B is zero when fresh)
            torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.05)
    torch.manual_seed(0)
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, stop_token_ids=[tokenizer.eos_token_id],
                              return_logprobs=True)
    out = HFRolloutEngine(model, tokenizer.pad_token_id, compiled_decode=True).generate(prompts, sampling).batch
    assert out["position_ids"].shape == (6, 3, out["input_ids"].shape[1])
    assert len(out.non_tensors["multi_modal_inputs"]) == 6  # each sample keeps its prompt's images
    banned = vision_token_ids(model)
    assert len(banned) == 4 and not torch.isin(out["responses"], torch.tensor(banned)).any()
    with torch.no_grad():  # the actor's forward over the batch's 3-D ids, full vocabulary
        expected, _ = response_logprobs(model, out["input_ids"], out["attention_mask"], out["position_ids"],
                                        out["responses"], 1.0,
                                        model_inputs=multi_modal_kwargs(out.non_tensors["multi_modal_inputs"], "cpu"))
        # transformers alone (its own rope index), renormalised without the banned tokens as the rollout samples
        ids = out["input_ids"]
        logits = model(input_ids=ids, attention_mask=out["attention_mask"],
                       mm_token_type_ids=(ids == model.config.image_token_id).int(),
                       **multi_modal_kwargs(out.non_tensors["multi_modal_inputs"], "cpu")).logits.float()
    logits = logits[:, -9:-1]
    full = torch.log_softmax(logits, -1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    renormalised = torch.log_softmax(logits.index_fill(-1, torch.tensor(banned), float("-inf")), -1)
    renormalised = renormalised.gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    mask = out["response_mask"].bool()
    torch.testing.assert_close(expected[mask], full[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["rollout_logprobs"][mask], renormalised[mask], rtol=1e-5, atol=1e-5)


def test_images_for_a_text_module_are_refused(tmp_path, tiny_model_dir):
    folder = save_random_vl_model(str(tmp_path / "vl"))
    prompts, tokenizer = _prompts(folder, tmp_path)
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="prompts carry images but the rollout module .* not a Qwen-VL model"):
        engine.generate(prompts, SamplingParams(n=1, max_new_tokens=2))


class _TowerInputs:
    """Records the patches each call of a vision tower receives (a forward pre-hook)."""

    def __init__(self, tower):
        self.patches: list[int] = []
        tower.register_forward_pre_hook(lambda _, args, kwargs: self.patches.append(
            (args[0] if args else kwargs["hidden_states"]).shape[0]), with_kwargs=True)


@pytest.mark.parametrize("kind", VL_KINDS)
@pytest.mark.parametrize("greedy", [True, False])
def test_prefill_encodes_each_prompt_once(kind, greedy, tmp_path, monkeypatch):
    """Each prompt's images go through the vision tower once (not once per sample), and the tokens and log-probs equal
    the path that hands ``generate`` the pixels repeated per sample (fp32; sampled with the same seed too). Handed
    the pixels, the tower still computes each prompt's images once (npu_rl.models.vision_dedup), unless
    ``NPU_RL_VISION_DEDUP=0``."""
    folder = save_random_vl_model(str(tmp_path / kind), kind, seed=5)
    prompts, tokenizer = _prompts(folder, tmp_path)
    model = load_causal_lm(folder)
    tower = _TowerInputs(model.model.visual)
    computed = _TowerInputs(model.model.visual.patch_embed)  # what the tower computes
    n = 3
    sampling = SamplingParams(n=n, temperature=0.0 if greedy else 1.0, max_new_tokens=6,
                              stop_token_ids=[tokenizer.eos_token_id], return_logprobs=True)
    engine = HFRolloutEngine(model, tokenizer.pad_token_id)
    outs = {}
    for once, dedup in ((False, "0"), (False, "1"), (True, "1")):
        monkeypatch.setenv("NPU_RL_VISION_DEDUP", dedup)
        engine.encode_images_once = once
        torch.manual_seed(3)
        outs[once, dedup] = engine.generate(prompts, sampling).batch
    prompt_patches = sum(len(row["pixel_values"]) for row in prompts.non_tensors["multi_modal_inputs"] if row)
    assert prompt_patches > 0
    # per sample: one call over every sample's pixels (computed in full, or each prompt's once); once: one call over
    # each prompt's pixels
    assert tower.patches == [n * prompt_patches, n * prompt_patches, prompt_patches]
    assert computed.patches == [n * prompt_patches, prompt_patches, prompt_patches]
    plain = outs[False, "0"]
    for key in ("responses", "response_mask", "position_ids"):
        for other in (outs[False, "1"], outs[True, "1"]):
            torch.testing.assert_close(other[key], plain[key], rtol=0, atol=0)
    for other in (outs[False, "1"], outs[True, "1"]):
        torch.testing.assert_close(other["rollout_logprobs"], plain["rollout_logprobs"], rtol=1e-5, atol=1e-5)
    rows = outs[True, "1"].non_tensors["multi_modal_inputs"]
    assert rows[0] is rows[n - 1]
