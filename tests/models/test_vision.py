"""Qwen-VL actors: response log-probs from our forward (3-D rotary ids computed by the data layer, the swapped
lm_head, logits for the response only) equal transformers' own forward (its get_rope_index, full logits), fp32,
for tiny random Qwen2.5-VL and Qwen3-VL; loading a saved folder's model and image side."""

import pytest
import torch
from PIL import Image

from npu_rl.data.images import VisionInputs, VisionSpec, expand_image_tags, mrope_position_ids
from npu_rl.models.forward import LogprobOptions, packed_response_logprobs, response_logprobs
from npu_rl.models.synthetic import (
    VL_KINDS,
    random_vl_model,
    save_random_vl_model,
    tiny_image_processor,
    vl_char_tokenizer,
)
from npu_rl.models.vision import (
    encode_images,
    freeze_vision_tower,
    load_vision_inputs,
    load_vl_model,
    multi_modal_kwargs,
    vision_tower,
    vision_tower_frozen,
)
from npu_rl.parallel.attention import use_varlen_attention
from npu_rl.rollout.utils import assemble_rollout_batch


def _batch(kind):
    """Three prompts (two images, none, one image), left-padded, with right-padded responses of random tokens."""
    tokenizer = vl_char_tokenizer()
    processor = tiny_image_processor(patch_size=14 if kind == "qwen2_5_vl" else 16)
    vision = VisionInputs(VisionSpec.from_image_processor(processor), processor,
                          tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    pictures = [[(50, 40), (30, 90)], [], [(60, 60)]]
    texts = ["ab<image>cd<image>e", "only text here", "x<image>?"]
    rows = []
    for sizes, text in zip(pictures, texts):
        images = [vision.spec.load(Image.new("RGB", s, (17 * len(s), 200, 30))) for s in sizes]
        inputs = vision.spec.encode(images, processor) if images else {}
        counts = [int(g.prod()) // 4 for g in inputs["image_grid_thw"]] if images else []
        rows.append((tokenizer(expand_image_tags(text, counts), add_special_tokens=False)["input_ids"], inputs))
    width = max(len(ids) for ids, _ in rows) + 1
    prompt_ids = torch.zeros(3, width, dtype=torch.long)
    prompt_mask = torch.zeros(3, width, dtype=torch.long)
    for r, (ids, _) in enumerate(rows):
        prompt_ids[r, width - len(ids):] = torch.tensor(ids)
        prompt_mask[r, width - len(ids):] = 1
    mm = [inputs for _, inputs in rows]
    grid = torch.cat([m["image_grid_thw"] for m in mm if m])
    from npu_rl.data.dataset import object_array
    from npu_rl.protocol import Batch
    prompts = Batch({"input_ids": prompt_ids, "attention_mask": prompt_mask,
                     "position_ids": mrope_position_ids(prompt_ids, prompt_mask, grid, vision.image_token_id, 2)},
                    {"multi_modal_inputs": object_array(mm)})
    generator = torch.Generator().manual_seed(0)
    responses = torch.randint(3, 100, (3, 6), generator=generator)
    response_mask = torch.ones(3, 6, dtype=torch.long)
    response_mask[1, 4:] = 0
    return assemble_rollout_batch(prompts, responses, response_mask, 1, 0), vision, tokenizer


def _reference(model, batch, vision):
    """transformers alone: its own rope index (from mm_token_type_ids), all logits, log-softmax, gather."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    inputs = multi_modal_kwargs(batch.non_tensors["multi_modal_inputs"], "cpu")
    logits = model(input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == vision.image_token_id).int(),
                   use_cache=False, **inputs).logits.float()
    width = batch["responses"].shape[1]
    logprobs = torch.log_softmax(logits[:, -width - 1:-1], -1)
    return logprobs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("kind", VL_KINDS)
def test_logprobs_equal_transformers_forward(kind):
    batch, vision, tokenizer = _batch(kind)
    model = random_vl_model(kind, tokenizer, seed=1).eval()
    assert batch["position_ids"].shape == (3, 3, batch["input_ids"].shape[1])  # [B, 3, T]: rows split on dim 0
    with torch.no_grad():
        expected = _reference(model, batch, vision)
        ours, entropy = response_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                          batch["responses"], 1.0, LogprobOptions(compute_entropy=True),
                                          model_inputs=multi_modal_kwargs(batch.non_tensors["multi_modal_inputs"],
                                                                          "cpu"))
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(ours[mask], expected[mask], rtol=1e-5, atol=1e-6)
    assert (entropy[mask] > 0).all()
    # the images matter: without them (pads only) the log-probs of the image rows move
    with torch.no_grad():
        blind = response_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                  batch["responses"], 1.0, model_inputs={
                                      "pixel_values": multi_modal_kwargs(batch.non_tensors["multi_modal_inputs"],
                                                                         "cpu")["pixel_values"] * 0 + 1,
                                      "image_grid_thw": multi_modal_kwargs(batch.non_tensors["multi_modal_inputs"],
                                                                           "cpu")["image_grid_thw"]})[0]
    assert not torch.allclose(blind[0], ours[0]) and torch.allclose(blind[1], ours[1], rtol=1e-5, atol=1e-6)


def test_gradients_reach_the_vision_tower():
    batch, _, tokenizer = _batch("qwen2_5_vl")
    model = random_vl_model("qwen2_5_vl", tokenizer, seed=2)
    logprobs, _ = response_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                    batch["responses"], 1.0,
                                    model_inputs=multi_modal_kwargs(batch.non_tensors["multi_modal_inputs"], "cpu"))
    (logprobs * batch["response_mask"]).sum().backward()
    tower = vision_tower(model)
    assert tower is not None and all(p.grad is not None and p.grad.abs().sum() > 0
                                     for p in tower.patch_embed.parameters())


@pytest.mark.parametrize("kind", VL_KINDS)
def test_packed_forward_equals_padded(kind):
    """Remove-padding: rows packed into one sequence (varlen attention in the language model, the vision tower's
    windows and pictures packed per segment), each of the 3 rotary axes packed like the ids."""
    batch, _, tokenizer = _batch(kind)
    model = random_vl_model(kind, tokenizer, seed=5).eval()
    images = multi_modal_kwargs(batch.non_tensors["multi_modal_inputs"], "cpu")
    args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"], 1.0,
            LogprobOptions(compute_entropy=True))
    with torch.no_grad():
        padded = response_logprobs(model, *args, model_inputs=images)
        use_varlen_attention(model)
        assert model.model.visual.config._attn_implementation == "npu_rl_flash_vision"
        packed = packed_response_logprobs(model, *args, model_inputs=images)
    mask = batch["response_mask"].bool()
    for ours, theirs in zip(packed, padded):
        torch.testing.assert_close(ours[mask], theirs[mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", VL_KINDS)
def test_saved_folder_loads_model_and_image_side(kind, tmp_path):
    folder = save_random_vl_model(str(tmp_path / kind), kind, seed=3)
    vision = load_vision_inputs(folder, {"max_pixels": 32 * 32 * 4})
    assert vision.spec.max_pixels == 32 * 32 * 4 and vision.spec.min_pixels == 28 * 28
    assert vision.spec.patch_size == (14 if kind == "qwen2_5_vl" else 16)
    assert vision.image_token_id == vl_char_tokenizer().convert_tokens_to_ids("<|image_pad|>")
    model = load_vl_model(folder)
    reference = random_vl_model(kind, seed=3)
    for (name, ours), (_, theirs) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(ours, theirs, msg=name)


class _CountCalls:
    """Counts the forwards of a module (a hook)."""

    def __init__(self, module):
        self.calls = 0
        module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))


@pytest.mark.parametrize("kind", VL_KINDS)
@pytest.mark.parametrize("packed", [False, True])
def test_features_encoded_once_per_prompt_equal_per_row_pixels(kind, packed):
    """Three prompts x n=3 samples: the batch's image dicts are encoded in one vision forward (one per distinct
    dict), and the log-probs of any micro-batch fed those features equal the plain path's (pixels per row; the
    vision tower runs in every forward), at fp32 1e-5. Qwen3-VL's deepstack features go through as well."""
    batch, _, tokenizer = _batch(kind)
    n = 3
    batch = batch.repeat(n)  # a prompt's samples share its multi_modal_inputs object, as after the rollout
    model = random_vl_model(kind, tokenizer, seed=7).eval()
    if packed:
        use_varlen_attention(model)
    forward = packed_response_logprobs if packed else response_logprobs
    counter = _CountCalls(vision_tower(model))
    rows = batch.non_tensors["multi_modal_inputs"]
    with torch.no_grad():
        features = encode_images(model, rows, "cpu")
        assert counter.calls == 1 and len(features.pooled) == 2  # two of the three prompts have images
        assert (features.deepstack is not None) == (kind == "qwen3_vl")
        for micro in (slice(0, 4), slice(4, 9)):  # micro-batches cutting through a prompt's samples
            mb = batch.index(micro)
            args = (mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"], 1.0,
                    LogprobOptions(compute_entropy=True))
            cached = forward(model, *args, model_inputs=features.model_inputs(mb.non_tensors["multi_modal_inputs"]))
            calls = counter.calls
            plain = forward(model, *args, model_inputs=multi_modal_kwargs(mb.non_tensors["multi_modal_inputs"], "cpu"))
            assert counter.calls == calls + 1  # the plain path ran the tower; the cached one did not
            mask = mb["response_mask"].bool()
            for ours, theirs in zip(cached, plain):
                torch.testing.assert_close(ours[mask], theirs[mask], rtol=1e-5, atol=1e-6)
    assert counter.calls == 3
    assert features.model_inputs([{}, None]) == {}
    with pytest.raises(KeyError, match="not encoded"):
        features.model_inputs([dict(rows[0])])  # an equal dict that is another object was not part of the batch


def test_freeze_vision_tower():
    model = random_vl_model("qwen2_5_vl", vl_char_tokenizer(), seed=3)
    assert not vision_tower_frozen(model)
    assert freeze_vision_tower(model) == len(list(vision_tower(model).parameters()))
    assert vision_tower_frozen(model)
    assert all(p.requires_grad for n, p in model.named_parameters() if not n.startswith("model.visual."))
    with pytest.raises(ValueError, match="freeze_vision_tower=True.*no vision tower"):
        freeze_vision_tower(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kind", VL_KINDS)
def test_the_packed_vision_attention_equals_the_per_window_loop(kind, monkeypatch):
    """After use_varlen_attention the vision tower attends through one packed call a block (npu_rl_flash_vision:
    transformers passes it the windows' and pictures' cu_seqlens) instead of one SDPA call per window: the image
    features equal the sdpa tower's, in values and in the gradients of the tower's weights (fp32)."""
    import copy

    from npu_rl.parallel import attention

    batch, _, tokenizer = _batch(kind)
    plain = random_vl_model(kind, tokenizer, seed=9)
    packed = use_varlen_attention(copy.deepcopy(plain))
    assert vision_tower(packed).config._attn_implementation == "npu_rl_flash_vision"
    segments = []
    kernel_of = attention.select_bidirectional_kernel
    monkeypatch.setattr(attention, "select_bidirectional_kernel", lambda: (segments.append(1), kernel_of())[1])
    inputs = multi_modal_kwargs(batch.non_tensors["multi_modal_inputs"], "cpu")
    outs = []
    for model in (plain, packed):
        features = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output
        features = torch.cat(list(features))
        (features ** 2).sum().backward()
        outs.append((features.detach(), [p.grad for p in vision_tower(model).parameters()]))
    assert segments  # the packed path ran (once per block)
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_npu_rl_vision_attention_transformers_keeps_the_per_window_tower(monkeypatch):
    monkeypatch.setenv("NPU_RL_VISION_ATTENTION", "transformers")
    model = use_varlen_attention(random_vl_model("qwen2_5_vl", vl_char_tokenizer(), seed=3))
    assert vision_tower(model).config._attn_implementation == "sdpa"
    assert model.config.text_config._attn_implementation == "npu_rl_varlen"
