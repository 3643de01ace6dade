"""One vision-tower computation per distinct image of a forward (npu_rl/models/vision_dedup.py): tiny random
Qwen2.5-VL and Qwen3-VL (fp32), micro-batches whose rows share image dicts, against the forward that computes every
row's copy: log-probs and every parameter's gradient equal, and the tower computes the distinct images only; a call
that does not match the plan computes everything."""

import pytest
import torch
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

from npu_rl.models.forward import LogprobOptions, packed_response_logprobs, response_logprobs
from npu_rl.models.lora import LoraSpec, apply_lora
from npu_rl.models.synthetic import VL_KINDS, random_vl_model
from npu_rl.models.vision import multi_modal_kwargs, vision_tower
from npu_rl.models.vision_dedup import (
    DEDUP_ENV,
    DedupPlan,
    _expand,
    _Expansion,
    dedup_plan,
    installed_tower_dedup,
    vision_dedup,
    vision_dedup_enabled,
)
from npu_rl.parallel.attention import use_varlen_attention
from tests.models.test_vision import _batch


class _ComputedPatches:
    """The patches the tower computes, per call: what its patch embedding receives (a hook)."""

    def __init__(self, model):
        self.calls: list[int] = []
        vision_tower(model).patch_embed.register_forward_pre_hook(lambda _, args: self.calls.append(len(args[0])))


def _patches(rows) -> int:
    return sum(len(row["pixel_values"]) for row in rows if row)


def _distinct(rows) -> list:
    return list({id(row): row for row in rows if row}.values())


def test_the_plan_maps_each_image_to_its_first_copy():
    a = {"pixel_values": torch.zeros(8, 2), "image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 2]])}
    b = {"pixel_values": torch.zeros(4, 2), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    # rows a a (text) b a: images a0 a1 | a0 a1 | b0 | a0 a1 -> distinct a0=0, a1=1, b0=2
    plan = dedup_plan([a, a, None, b, a])
    assert plan == DedupPlan((0, 1, 0, 1, 2, 0, 1)) and plan.originals == (0, 1, 4)
    assert dedup_plan([a, b, {}]) is None  # nothing repeats
    assert dedup_plan([a, dict(a)]) is None  # an equal dict that is another object is not known to be a copy
    assert dedup_plan(None) is None


def test_the_switch(monkeypatch):
    assert vision_dedup_enabled()
    for off in ("0", "false", "off"):
        monkeypatch.setenv(DEDUP_ENV, off)
        assert not vision_dedup_enabled()
    monkeypatch.setenv(DEDUP_ENV, "1")
    assert vision_dedup_enabled()


def _forward(model, mb, forward, dedup: bool):
    rows = mb.non_tensors["multi_modal_inputs"]
    with vision_dedup(model, rows if dedup else None) as state:
        out = forward(model, mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"], 1.0,
                      LogprobOptions(compute_entropy=True), model_inputs=multi_modal_kwargs(rows, "cpu"))
    return out, state


@pytest.mark.parametrize("kind", VL_KINDS)
@pytest.mark.parametrize("packed", [False, True])
def test_deduplicated_tower_equals_every_row_computed(kind, packed):
    """3 prompts (two images, text only, one image) x n=3, in micro-batches that cut through a prompt's samples:
    log-probs, entropy and the gradient of every parameter (vision tower and language model) equal the forward
    that computes each row's copy (fp32, 1e-5), and the tower computes each distinct image of a micro-batch once."""
    batch, _, tokenizer = _batch(kind)
    batch = batch.repeat(3)  # a prompt's samples share its multi_modal_inputs object, as after the rollout
    model = random_vl_model(kind, tokenizer, seed=11)
    if packed:
        use_varlen_attention(model)
    forward = packed_response_logprobs if packed else response_logprobs
    computed = _ComputedPatches(model)
    for micro in (slice(0, 4), slice(4, 9)):
        mb = batch.index(micro)
        rows = mb.non_tensors["multi_modal_inputs"]
        results = {}
        for dedup in (False, True):
            model.zero_grad(set_to_none=True)
            (logprobs, entropy), state = _forward(model, mb, forward, dedup)
            mask = mb["response_mask"]
            ((logprobs * mask).sum() + 0.1 * (entropy * mask).sum()).backward()
            results[dedup] = (logprobs.detach(), entropy.detach(),
                              {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
        assert computed.calls[-2:] == [_patches(rows), _patches(_distinct(rows))]
        assert _patches(_distinct(rows)) < _patches(rows)
        assert state.fallbacks == 0
        (plain_lp, plain_ent, plain_grads), (lp, ent, grads) = results[False], results[True]
        mask = mb["response_mask"].bool()
        torch.testing.assert_close(lp[mask], plain_lp[mask], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ent[mask], plain_ent[mask], rtol=1e-5, atol=1e-6)
        assert grads.keys() == plain_grads.keys()
        assert any(name.startswith("model.visual.") for name in grads)
        assert any(name.startswith("model.language_model.") for name in grads)
        for name, grad in grads.items():
            scale = plain_grads[name].abs().max().clamp(min=1e-6)
            torch.testing.assert_close(grad / scale, plain_grads[name] / scale, rtol=1e-5, atol=1e-5, msg=name)


def _tower_call(model, pixels, grid, **kwargs):
    return vision_tower(model)(pixels, grid_thw=grid, return_dict=True, **kwargs)


@pytest.mark.parametrize("kind", VL_KINDS)
def test_a_call_that_does_not_match_the_plan_computes_everything(kind):
    """Under a plan for rows (a, a, b), tower calls that are not that input compute every image: other pixels
    in a copy's place, another number of images, a grid-derived tensor precomputed for the full set; the plan's own
    call computes the distinct ones, with the same output."""
    batch, _, tokenizer = _batch(kind)
    model = random_vl_model(kind, tokenizer, seed=12).eval()
    a, _, b = batch.non_tensors["multi_modal_inputs"]
    rows = [a, a, b]
    inputs = multi_modal_kwargs(rows, "cpu")
    pixels, grid = inputs["pixel_values"], inputs["image_grid_thw"]
    computed = _ComputedPatches(model)
    with torch.no_grad():
        full = _tower_call(model, pixels, grid)
        changed = pixels.clone()
        changed[len(a["pixel_values"])] += 1.0  # the copy of a's first image differs in one patch
        fewer = multi_modal_kwargs([a, b], "cpu")
        cu_seqlens = torch.nn.functional.pad(grid.prod(-1).cumsum(0), (1, 0)).int()
        with vision_dedup(model, rows) as state:
            planned = _tower_call(model, pixels, grid)
            assert computed.calls[-1] == _patches([a, b])
            for other in ((changed, grid), (fewer["pixel_values"], fewer["image_grid_thw"])):
                _tower_call(model, *other)
                assert computed.calls[-1] == len(other[0])
            _tower_call(model, pixels, grid, cu_seqlens=cu_seqlens)
            assert computed.calls[-1] == len(pixels)
            assert state.fallbacks == 3
            again = _tower_call(model, pixels, grid)  # the plan still holds for its own input
            assert computed.calls[-1] == _patches([a, b])
    for ours in (planned, again):
        assert ours.keys() == full.keys()
        torch.testing.assert_close(ours.pooler_output, full.pooler_output, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.last_hidden_state, full.last_hidden_state, rtol=1e-5, atol=1e-6)
        if kind == "qwen3_vl":
            for mine, theirs in zip(ours.deepstack_features, full.deepstack_features, strict=True):
                torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    assert installed_tower_dedup(model).plan is None  # the plan lives for the block only


def test_nothing_applies_when_off_or_nothing_repeats(monkeypatch):
    batch, _, tokenizer = _batch("qwen2_5_vl")
    model = random_vl_model("qwen2_5_vl", tokenizer, seed=13)
    rows = list(batch.non_tensors["multi_modal_inputs"])
    with vision_dedup(model, rows) as state:  # three different dicts
        assert state is None
    with vision_dedup(torch.nn.Linear(2, 2), [rows[0], rows[0]]) as state:  # no tower
        assert state is None
    monkeypatch.setenv(DEDUP_ENV, "0")
    with vision_dedup(model, [rows[0], rows[0]]) as state:
        assert state is None


def test_an_output_it_cannot_expand_raises_naming_the_switch():
    expansion = _Expansion(torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0]), distinct_patches=2, distinct_tokens=1)
    out = _expand({"a": torch.ones(2, 3), "b": (torch.ones(1, 3), None)}, expansion)
    assert out["a"].shape == (4, 3) and out["b"][0].shape == (2, 3) and out["b"][1] is None
    with pytest.raises(RuntimeError, match=f"neither .* {DEDUP_ENV}=0"):
        _expand([torch.ones(3, 3)], expansion)


def test_the_qwen2_vl_tower_and_its_gradients():
    """Qwen2-VL's tower (no tiny full model here: the tower alone, under a stand-in model): rows (a, b, a) with a
    holding two images computes 3 images, not 5, with equal outputs and tower gradients (fp32)."""
    torch.manual_seed(0)
    config = Qwen2VLVisionConfig(depth=2, embed_dim=32, hidden_size=48, num_heads=2, mlp_ratio=2, patch_size=14,
                                 spatial_merge_size=2, temporal_patch_size=2)
    tower = Qwen2VisionTransformerPretrainedModel._from_config(config).float()
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.visual = tower
    channels = 3 * 2 * 14 * 14

    def image(side: int) -> dict:
        grid = torch.tensor([[1, side, side]])
        return {"pixel_values": torch.randn(side * side, channels), "image_grid_thw": grid}

    a0, a1, b = image(4), image(2), image(6)
    a = {"pixel_values": torch.cat([a0["pixel_values"], a1["pixel_values"]]),
         "image_grid_thw": torch.cat([a0["image_grid_thw"], a1["image_grid_thw"]])}
    rows = [a, b, a]
    inputs = multi_modal_kwargs(rows, "cpu")
    computed = _ComputedPatches(model)
    outs = {}
    for dedup in (False, True):
        tower.zero_grad(set_to_none=True)
        with vision_dedup(model, rows if dedup else None):
            out = tower(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
        ((out.pooler_output ** 2).sum() + out.last_hidden_state.sum()).backward()
        outs[dedup] = (out, {name: p.grad.clone() for name, p in tower.named_parameters()})
    assert computed.calls == [_patches(rows), _patches([a, b])]
    (plain, plain_grads), (ours, grads) = outs[False], outs[True]
    torch.testing.assert_close(ours.pooler_output, plain.pooler_output, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.last_hidden_state, plain.last_hidden_state, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-5, atol=1e-5, msg=name)


def test_a_peft_model_finds_its_tower():
    batch, _, tokenizer = _batch("qwen2_5_vl")
    model = apply_lora(random_vl_model("qwen2_5_vl", tokenizer, seed=14), LoraSpec(rank=4), seed=1)
    row = batch.non_tensors["multi_modal_inputs"][0]
    with vision_dedup(model, [row, row]) as state:
        assert state is not None and state.plan.num_images == 2 * len(row["image_grid_thw"])
