"""The planner counts a Qwen-VL model's vision tower (npu_rl/plan/vision.py): its parameters against transformers'
own models built on the meta device, the bytes its forward saves for backward against ``saved_tensors_hooks`` on
transformers' towers, and what the tower adds to each phase's memory and seconds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from npu_rl.plan.job import job_images, plan_config
from npu_rl.plan.model_shape import shape_from_config
from npu_rl.plan.memory import GIB, RoleMemory, TrainSettings
from npu_rl.plan.vision import (VisionShape, image_load, parse_image_size, prompts_in_micro_batch, shapes_image_side,
                                transformers_encodes_once, vision_shape_from_config)

# Qwen/Qwen2.5-VL-7B-Instruct's vision_config (scripts/gpu/vl_grpo_step.py) and language width
QWEN2_5_VL_7B_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                            fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu", in_chans=3)
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=96, tie_word_embeddings=False)
TINY = {
    "qwen2_5_vl": dict(model_type="qwen2_5_vl", text_config=dict(TEXT, rope_parameters={
        "rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 10000.0}),
        vision_config=dict(depth=3, hidden_size=160, intermediate_size=432, num_heads=2, out_hidden_size=64,
                           window_size=56, fullatt_block_indexes=[2])),
    "qwen2_vl": dict(model_type="qwen2_vl", text_config=dict(TEXT, rope_parameters={
        "rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 10000.0}),
        vision_config=dict(depth=3, embed_dim=160, mlp_ratio=2, num_heads=2, hidden_size=64)),
    "qwen3_vl": dict(model_type="qwen3_vl", text_config=dict(TEXT, head_dim=16, rope_parameters={
        "rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 10000.0, "mrope_interleaved": True}),
        vision_config=dict(depth=3, hidden_size=144, intermediate_size=400, num_heads=2, out_hidden_size=64,
                           num_position_embeddings=64, deepstack_visual_indexes=[0, 1])),
}


def _meta_model(cfg: dict):
    from transformers import AutoConfig, AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(AutoConfig.for_model(**cfg))


@pytest.mark.parametrize("kind", sorted(TINY))
def test_tower_and_whole_model_parameters_equal_transformers(kind):
    model = _meta_model(TINY[kind])
    shape = shape_from_config(TINY[kind])
    tower = model.model.visual
    assert shape.vision.num_params == sum(p.numel() for p in tower.parameters())
    assert shape.vision.block_params == sum(p.numel() for p in tower.blocks[0].parameters())
    assert shape.num_params == sum(p.numel() for p in model.parameters())


def test_qwen2_5_vl_7b_tower_by_hand_and_against_transformers():
    cfg = dict(model_type="qwen2_5_vl", text_config=dict(TEXT, hidden_size=3584, num_attention_heads=28,
                                                        num_key_value_heads=4, num_hidden_layers=1),
               vision_config=QWEN2_5_VL_7B_VISION)
    vision = vision_shape_from_config(cfg)
    # patch embed 3 x 2 x 14 x 14 x 1280 = 1,505,280; a block: 2 RMSNorms 2,560 + qkv 1280 x 3840 + 3840 (4,919,040)
    # + proj 1280 x 1280 + 1280 (1,639,680) + gate/up 2 x (1280 x 3420 + 3420) (8,762,040) + down 3420 x 1280 + 1280
    # (4,378,880) = 19,702,200
    assert vision.patch_embed_params == 1_505_280
    assert vision.block_params == 19_702_200
    # merger: RMSNorm 1,280 + 5120 x 5120 + 5120 (26,219,520) + 5120 x 3584 + 3584 (18,353,664) = 44,574,464
    assert vision.merger_params == 44_574_464
    assert vision.num_params == 676_550_144  # 1,505,280 + 32 x 19,702,200 + 44,574,464
    assert vision.num_params == sum(p.numel() for p in _meta_model(cfg).model.visual.parameters())


def _saved_bytes(model, pixels, grid) -> int:
    """Bytes the tower's forward saves for backward, deduplicated by storage, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(pixels, grid_thw=grid)
    return sum(seen.values())


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("kind", sorted(TINY))
def test_saved_bytes_per_patch_are_what_transformers_towers_save(kind, checkpointing):
    """The slope between two picture sizes (every term is per patch) of a bf16 tower's saved tensors equals the
    planner's bytes per patch, blocks and the rest, with and without gradient checkpointing."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(**TINY[kind])
    vision = vision_shape_from_config(TINY[kind])
    torch.manual_seed(0)
    tower = _meta_model(TINY[kind]).model.visual.__class__._from_config(config.vision_config).to(torch.bfloat16)
    tower.config._attn_implementation = "sdpa"
    if checkpointing:
        tower.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tower.train()
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    per_size = {}
    for side in (8, 16):  # merged tokens a side: 8 x 8 and 16 x 16 windows of 2 x 2 patches
        grid = torch.tensor([[1, 2 * side, 2 * side]])
        pixels = torch.randn(4 * side * side, patch, dtype=torch.bfloat16)
        per_size[4 * side * side] = _saved_bytes(tower, pixels, grid)
    (small, a), (large, b) = sorted(per_size.items())
    assert (b - a) / (large - small) == vision.saved_bytes_per_patch(checkpointing)


def test_qwen3_vl_and_qwen2_vl_read_their_own_keys():
    vision = vision_shape_from_config(TINY["qwen2_vl"])
    assert (vision.hidden_size, vision.intermediate_size, vision.out_hidden_size) == (160, 320, 64)
    vision = vision_shape_from_config(TINY["qwen3_vl"])
    assert (vision.num_deepstack, vision.num_position_embeddings, vision.patch_size) == (2, 64, 16)
    assert vision_shape_from_config({"model_type": "qwen2", "hidden_size": 8}) is None


# ---------------------------------------------------------------------------------------------- the job's images
def test_images_from_the_shapes_task_the_flags_and_the_bounds():
    vision = vision_shape_from_config(dict(model_type="qwen2_5_vl", text_config=TEXT,
                                           vision_config=QWEN2_5_VL_7B_VISION))
    assert shapes_image_side("builtin://shapes/train?size=448&num_train=8") == 448
    assert shapes_image_side(["'builtin://shapes/train'"]) == 112
    assert shapes_image_side("~/data/geo3k/train.parquet") is None
    bounds = (28 * 28, 448 * 448)
    load = image_load(vision, images_per_prompt=None, image_size=None, train_files="builtin://shapes/train?size=448",
                      max_prompt_length=512, bounds=bounds, encode_once=False)
    assert (load.images_per_prompt, load.patches_per_image, vision.image_tokens(1024)) == (1, 1024, 256)
    # 640 x 480 resized within 448 x 448 pixels: smart_resize keeps the ratio on multiples of 28 -> 504 x 364
    told = image_load(vision, images_per_prompt=2, image_size=parse_image_size("640x480"), train_files=None,
                      max_prompt_length=4096, bounds=bounds, encode_once=True)
    assert told.patches_per_image == (504 // 14) * (364 // 14) and told.patches_per_prompt == 2 * 936
    # unknown data: one picture at max_pixels (1,024 patches), cut to the prompt's 128 tokens (512 patches)
    cut = image_load(vision, images_per_prompt=None, image_size=None, train_files="x.parquet",
                     max_prompt_length=128, bounds=bounds, encode_once=True)
    assert cut.patches_per_image == 512 and "max_prompt_length=128" in cut.source
    with pytest.raises(ValueError, match="--image-size"):
        parse_image_size("big")


# ---------------------------------------------------------------------------------------------- memory and time
def _shape():
    return shape_from_config(dict(model_type="qwen2_5_vl", text_config=dict(
        TEXT, hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
        num_hidden_layers=4), vision_config=QWEN2_5_VL_7B_VISION))


def test_a_frozen_tower_has_no_gradients_or_optimizer_state_and_stays_in_the_master_dtype():
    shape = _shape()
    v = shape.vision_params
    trained = RoleMemory(shape, TrainSettings(), trainable=True)
    frozen = RoleMemory(shape, TrainSettings(freeze_vision=True), trainable=True)
    # one device, fp32 master + bf16 copy: a trained tower 4 + 2 bytes a parameter, a frozen one 4 (shared)
    assert trained.weights() - frozen.weights() == 2 * v
    assert trained.optimizer() - frozen.optimizer() == 8 * v
    assert trained.grads() - frozen.grads() == 6 * v
    sharded = RoleMemory(shape, TrainSettings(shard=4, freeze_vision=True), trainable=True)
    assert sharded.optimizer() == 8 * (shape.num_params - v) / 4 and sharded.weights() == 4 * shape.num_params / 4


def test_a_trained_tower_keeps_its_activations_a_frozen_one_only_its_working_set():
    shape = _shape()
    s = TrainSettings(micro_tokens=16 * 768, micro_response_tokens=16 * 256, update_vision_patches=16 * 1024)
    saved, working = RoleMemory(shape, s, trainable=True).vision_update()
    # checkpointing: 32 blocks x 2 x 1280 + pixels 2,352 + merger 12 x 1280 + window index 8 = 99,640 bytes a patch
    assert saved == 16 * 1024 * 99_640
    assert working == 16 * 1024 * shape.vision.block_saved_bytes()  # one block recomputed at a time
    saved, working = RoleMemory(shape, replace(s, freeze_vision=True), trainable=True).vision_update()
    # frozen on one device: no gradient, the working set of a forward in fp32 (the master's dtype)
    assert saved == 0 and working == 16 * 1024 * shape.vision.working_bytes_per_patch() * 2


def _vl_config(tmp_path, *extra):
    from npu_rl.config.loader import load_config

    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    cfg = dict(model_type="qwen2_5_vl", text_config=dict(TEXT, hidden_size=3584, intermediate_size=18944,
                                                         num_attention_heads=28, num_key_value_heads=4,
                                                         num_hidden_layers=4), vision_config=QWEN2_5_VL_7B_VISION)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 784, "max_pixels": 448 * 448}))
    overrides = [f"actor_rollout_ref.model.path={folder}", "data.train_files='builtin://shapes/train?size=448'",
                 "data.train_batch_size=32", "data.max_prompt_length=512", "data.max_response_length=256",
                 "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.name=hf",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32", "trainer.n_gpus_per_node=1",
                 "preset=grpo", *extra]
    return load_config(overrides, "ppo_trainer")


def test_the_plan_counts_the_tower_per_phase_and_says_what_it_assumed(tmp_path):
    """32 prompts x n = 8 on one device, update micro-batches of 16 rows, log-prob micro-batches of 32, a trained
    tower: ``once`` encodes each prompt once in the no-grad passes and 16 / 8 = 2 prompts' images in an update
    micro-batch; ``per-micro-batch`` (transformers < 5.19 with the tower's dedup) 32 / 8 = 4 prompts' in a log-prob
    micro-batch and 2 in an update one; ``per-row`` every row's."""
    config = _vl_config(tmp_path)
    once = plan_config(config, "h200", vision_encode="once")
    per_micro = plan_config(config, "h200", vision_encode="per-micro-batch")
    per_row = plan_config(config, "h200", vision_encode="per-row")
    assert any("1 a prompt x 1024 patches (256 image tokens), from builtin://shapes pictures of 448x448" in line
               and "in the update each micro-batch's forward encodes its distinct prompts' images" in line
               for line in once.model_lines)
    assert any("every row encodes its own images in every pass" in line for line in per_row.model_lines)
    vision = _shape().vision
    phases = {name: {p.name.split(" (")[0]: p for p in plan.phases}
              for name, plan in (("once", once), ("micro", per_micro), ("row", per_row))}
    # hf generate: one call over all 256 rows' pixels per row; each of the 32 prompts once, encoded once or deduplicated
    assert phases["row"]["rollout"].parts["vision encode"] == 256 * 1024 * vision.working_bytes_per_patch()
    for name in ("once", "micro"):
        assert phases[name]["rollout"].parts["vision encode"] == 32 * 1024 * vision.working_bytes_per_patch()
    update = {name: next(p for p in plan.phases if p.name.startswith("actor update"))
              for name, plan in (("once", once), ("micro", per_micro), ("row", per_row))}
    for name, prompts in (("once", 2), ("micro", 2), ("row", 16)):
        assert update[name].parts["vision activations"] == prompts * 1024 * vision.saved_bytes_per_patch(True)
    # time: the per-row passes run the tower n = 8 times as often in the log-prob and reference passes, and in the
    # update (16 rows a micro-batch encode 16 prompts' images instead of 2)
    t_once, t_micro, t_row = ({p.name: p.seconds for p in plan.time.phases} for plan in (once, per_micro, per_row))
    assert t_row["actor log-probs"] > t_micro["actor log-probs"] == pytest.approx(t_once["actor log-probs"])
    assert t_row["actor update"] > t_once["actor update"] == pytest.approx(t_micro["actor update"])
    frozen = plan_config(_vl_config(tmp_path, "actor_rollout_ref.actor.freeze_vision_tower=True"), "h200",
                         vision_encode="once")
    assert {p.name: p.seconds for p in frozen.time.phases}["actor update"] < t_once["actor update"]
    assert "vision activations" not in next(p for p in frozen.phases if p.name.startswith("actor update")).parts \
        or next(p for p in frozen.phases if p.name.startswith("actor update")).parts["vision activations"] == 0
    # shuffled update rows: a micro-batch's 16 rows are assumed to be 16 prompts
    shuffled = plan_config(_vl_config(tmp_path, "actor_rollout_ref.actor.shuffle=True"), "h200", vision_encode="once")
    assert next(p for p in shuffled.phases if p.name.startswith("actor update")).parts["vision activations"] == \
        update["row"].parts["vision activations"]
    with pytest.raises(ValueError, match="--vision-encode 'twice': expected once | per-micro-batch | per-row"):
        plan_config(config, "h200", vision_encode="twice")


def test_prompts_in_a_micro_batch():
    # n = 8: 16 rows are 2 prompts, 4 rows (fewer than n) 1, 20 rows ceil(2.5) = 3; n = 1: every row its own prompt
    assert [prompts_in_micro_batch(rows, 8) for rows in (16, 4, 20, 8, 0)] == [2, 1, 3, 1, 1]
    assert prompts_in_micro_batch(5, 1) == 5
    assert prompts_in_micro_batch(16, 8, grouped=False) == 16  # regrouped rows: no sharing assumed


def test_the_default_mode_follows_transformers_and_the_switch(tmp_path, monkeypatch):
    config = _vl_config(tmp_path)
    vision = _shape().vision
    once = transformers_encodes_once()  # transformers >= 5.19
    assert job_images(config, vision, None, None, None, None).mode == ("once" if once else "per-micro-batch")
    monkeypatch.setenv("NPU_RL_VISION_DEDUP", "0")
    assert job_images(config, vision, None, None, None, None).mode == ("once, per-row updates" if once else "per-row")
    assert job_images(config, vision, None, None, None, "per-micro-batch").mode == "per-micro-batch"


def test_vision_flops_per_patch_by_hand():
    vision = VisionShape("qwen2_vl", depth=1, hidden_size=8, intermediate_size=16, num_heads=2, out_hidden_size=4,
                         patch_size=2, temporal_patch_size=1, spatial_merge_size=2, in_channels=1)
    # embed 1 x 1 x 2 x 2 x 8 = 32; block linears: qkv 8x24+24 + proj 8x8+8 + fc1 8x16+16 + fc2 16x8+8 = 568;
    # merger linears 32x32+32 + 32x4+4 = 1188 over 4 patches = 297; attention 4 x 8 x 16 patches = 512
    assert vision.forward_flops_per_patch(16) == 2 * (32 + 568 + 297) + 512


def _no_grad_peak(model, pixels, grid) -> int:
    """The running total's peak of every CPU allocation and free in a no-grad forward (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(pixels, grid_thw=grid)
    current = peak = 0
    events = (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()
        peak = max(peak, current)
    return peak


NO_GRAD = [  # (family, width, MLP width, heads): one attention-bound, one MLP-bound each
    ("qwen2_5_vl", 640, 320, 8), ("qwen2_5_vl", 320, 1600, 4), ("qwen2_vl", 640, 640, 8), ("qwen2_vl", 320, 1600, 4),
    ("qwen3_vl", 576, 576, 8), ("qwen3_vl", 288, 4608, 4)]


@pytest.mark.parametrize("kind, width, mlp, heads", NO_GRAD)
def test_a_no_grad_forwards_peak_per_patch_is_the_planned_working_set(kind, width, mlp, heads):
    """The planner's working set of a forward without gradient against the profiler's allocation peak of
    transformers' bf16 tower (the slope between two picture sizes), within 2% (a few bytes a patch of allocator
    rounding move with the size)."""
    from transformers import Qwen2_5_VLVisionConfig, Qwen2VLVisionConfig, Qwen3VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    if kind == "qwen2_5_vl":
        config = Qwen2_5_VLVisionConfig(depth=2, hidden_size=width, intermediate_size=mlp, num_heads=heads,
                                        out_hidden_size=64, fullatt_block_indexes=[1])
        cls = Qwen2_5_VisionTransformerPretrainedModel
    elif kind == "qwen2_vl":
        config = Qwen2VLVisionConfig(depth=2, embed_dim=width, mlp_ratio=mlp // width, num_heads=heads, hidden_size=64)
        cls = Qwen2VisionTransformerPretrainedModel
    else:
        config = Qwen3VLVisionConfig(depth=2, hidden_size=width, intermediate_size=mlp, num_heads=heads,
                                     out_hidden_size=64, deepstack_visual_indexes=[0])
        cls = Qwen3VLVisionModel
    config._attn_implementation = "sdpa"
    vision = VisionShape(kind, 2, width, mlp, heads, 64, patch_size=config.patch_size,
                         num_deepstack=1 if kind == "qwen3_vl" else 0)
    torch.manual_seed(0)
    tower = cls(config).to(torch.bfloat16).eval()
    patch = 3 * 2 * config.patch_size ** 2
    peaks = {}
    for side in (8, 16):
        pixels = torch.randn(4 * side * side, patch, dtype=torch.bfloat16)
        peaks[4 * side * side] = _no_grad_peak(tower, pixels, torch.tensor([[1, 2 * side, 2 * side]]))
    (small, a), (large, b) = sorted(peaks.items())
    assert (b - a) / (large - small) == pytest.approx(vision.working_bytes_per_patch(), rel=0.02)
