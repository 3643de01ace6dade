"""The time model (npu_rl/plan/timing.py): FLOPs and bytes by hand on a tiny shape, the decode / prefill bounds, a
mixture of experts' active experts, the host floor per micro-batch, monotonicity, the CLI's time lines, and the docs'
calibration table and Atlas predictions against the code."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from npu_rl.commands.plan import main as plan_main
from npu_rl.models.synthetic import SHAPES
from npu_rl.plan import calibration, timing
from npu_rl.plan.memory import ModelShape, RolloutSettings, TrainSettings
from npu_rl.plan.vision import ImageLoad, VisionShape
from npu_rl.plan.timing import (
    SPEEDS,
    StepWork,
    TowerWork,
    decode_seconds,
    decode_weight_bytes,
    experts_touched,
    forward_bytes,
    forward_flops,
    kv_bytes_per_token,
    step_time,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "plan")
H200 = SPEEDS["h200"]
TINY = ModelShape(hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, num_kv_heads=1, vocab_size=10,
                  tied=False, attention_bias=False)
MOE = ModelShape(hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2, num_kv_heads=1, vocab_size=10,
                 tied=False, attention_bias=False, num_experts=4, experts_per_token=2, moe_intermediate_size=4)


def _shape(name: str) -> ModelShape:
    f = SHAPES[name]
    return ModelShape(f["hidden_size"], f["intermediate_size"], f["num_hidden_layers"], f["num_attention_heads"],
                      f["num_key_value_heads"], f["vocab_size"], f["tie_word_embeddings"])


def test_flops_and_bytes_of_a_tiny_shape_by_hand():
    # a layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192, MLP 3 x 8 x 16 = 384, two norms 16: 592; two layers 1,184
    assert timing.decoder_active_params(TINY) == 1184
    # 3 tokens at a mean context of 5, logits for 2 of them:
    # matmuls 2 x 3 x 1,184 = 7,104; attention 4 x 3 x 5 x (2 heads x 4) x 2 layers = 960; LM head 2 x 2 x 80 = 320
    assert forward_flops(TINY, 3, 2, 5) == (7104 + 960 + 320, 0)
    # elementwise 3 tokens x 2 layers x 8 x 110 = 5,280; logits 2 x 10 x 34 = 680
    assert forward_bytes(TINY, 3, 2) == 5280 + 680
    assert kv_bytes_per_token(TINY) == 2 * 4 * 2 * 2  # k and v, kv_dim 4, bf16, 2 layers


def test_moe_flops_use_active_experts_and_decode_reads_the_touched_ones():
    # one expert: 3 x 8 x 4 = 96; 2 of 4 run per token, in both (MoE) layers
    assert timing.expert_active_params(MOE) == 2 * 2 * 96
    _, experts = forward_flops(MOE, 5, 0, 1, lm_head=False)
    assert experts == 2 * 5 * 384
    assert experts_touched(MOE, 1) == pytest.approx(2.0)  # one token: its top-k
    assert experts_touched(MOE, 1000) == pytest.approx(4.0)  # many: all of them
    assert experts_touched(MOE, 2) == pytest.approx(4 * (1 - 0.5 ** 2))  # 3 expected of 4
    # one row reads the weights minus 2 unused experts in each of 2 layers (bf16)
    assert decode_weight_bytes(MOE, 1) == pytest.approx((MOE.num_params - 2 * 2 * 96) * 2)
    assert decode_weight_bytes(MOE, 1000) == pytest.approx(MOE.num_params * 2)
    assert decode_weight_bytes(TINY, 1) == TINY.num_params * 2  # dense: every weight


def test_decode_is_bandwidth_bound_for_few_rows_and_compute_bound_for_many(monkeypatch):
    shape = _shape("qwen2.5-7b")
    monkeypatch.setitem(timing.ENGINE_STEP, "vllm", (0.0, 0.0, 0.0))
    seconds, bound = decode_seconds(shape, H200, "vllm", rows=1, prompt_length=0, steps=1)
    assert bound == "memory"
    # one row at a context of 1: the bf16 weights and one token's KV cache over 72% of 4.8 TB/s (measured)
    expected = (shape.num_params * 2 + kv_bytes_per_token(shape)) / (4.8e12 * timing.DECODE_BANDWIDTH_EFFICIENCY)
    assert seconds == pytest.approx(expected)
    _, bound = decode_seconds(shape, H200, "vllm", rows=4096, prompt_length=0, steps=1)
    assert bound == "compute"


def _work(**changes) -> StepWork:
    fields = dict(prompts=16, train_prompts=16, n=4, prompt_length=128, response_length=256,
                  max_response_length=256, packed=False)
    return StepWork(**(fields | changes))


def _step(work: StepWork, engine: str = "vllm", device: str = "h200"):
    return step_time(actor_shape=_shape("qwen2.5-0.5b"), actor=TrainSettings(micro_tokens=64 * 384,
                                                                              forward_tokens=64 * 384),
                     ref=None, ref_in_actor=False, use_ref=True, critic_shape=None, critic=None,
                     rollout=RolloutSettings(engine=engine), world=1, devices_per_node=8, work=work, device=device,
                     device_name=device, kv_cache_bytes=50e9)


def test_prefill_is_compute_bound_and_time_grows_with_lengths_and_batch():
    base = _step(_work())
    assert next(p for p in base.phases if p.name == "rollout: prefill").bound == "compute"
    longer = [_step(_work(response_length=512, max_response_length=512)), _step(_work(prompt_length=512)),
              _step(_work(prompts=32, train_prompts=32)), _step(_work(n=8))]
    for other in longer:
        assert other.seconds > base.seconds
        for name in ("rollout: decode", "actor log-probs", "actor update"):
            assert other.phase(name) >= base.phase(name)
    assert _step(_work(), "hf") is not None and _step(_work(), device="cpu") is None
    # the same job on a slower device takes longer; the hf engine decodes eagerly on an Atlas
    assert _step(_work(), device="atlas-a2").seconds > base.seconds > 0
    assert "hf_eager" in next(p.detail for p in _step(_work(), "hf", "atlas-a3").phases if p.name == "rollout: decode")


def test_gradient_checkpointing_adds_a_forward_and_lora_drops_the_weight_gradients():
    shape, args = _shape("qwen2.5-1.5b"), dict(tokens=8192, response_tokens=4096, context=512)
    forward = timing.train_phase("f", shape, TrainSettings(), H200, 8, update=False, **args).seconds
    plain = timing.train_phase("u", shape, TrainSettings(gradient_checkpointing=False), H200, 8, update=True, **args)
    ckpt = timing.train_phase("u", shape, TrainSettings(), H200, 8, update=True, **args)
    lora = timing.train_phase("u", shape, TrainSettings(lora_rank=8), H200, 8, update=True, **args)
    assert 3 * forward < plain.seconds < ckpt.seconds and lora.seconds < ckpt.seconds
    # the recompute adds exactly one forward (compute), both updates carry the same optimizer step
    assert ckpt.seconds - plain.seconds == pytest.approx(forward)


@pytest.fixture(scope="module")
def model_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan_time") / "config.json"
    path.write_text(json.dumps({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
                                "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                                "num_key_value_heads": 2, "tie_word_embeddings": True}))
    return str(path)


@pytest.mark.parametrize("device", ["h200", "h100", "atlas-a2", "atlas-a3"])
def test_the_cli_prints_the_time_lines(model_config, capsys, device):
    assert plan_main(["--device", device, "--model-config", model_config, "algorithm.adv_estimator=grpo"]) in (0, 1)
    out = capsys.readouterr().out
    assert "memory plan:" in out and "phase (roofline estimate)" in out and "actor update" in out
    verdict = next(line for line in out.splitlines() if line.startswith("time plan (roofline estimate, not a "
                                                                         "measurement): "))
    assert " s/step, " in verdict and "tokens/s per device" in verdict
    assert ("assumed here" in verdict) == (device != "h200")


def test_the_cli_says_when_there_is_no_time_model_and_refuses_a_bad_mean_length(model_config, capsys):
    plan_main(["--device", "cpu", "--model-config", model_config, "algorithm.adv_estimator=grpo"])
    assert "time plan: no roofline for CPU" in capsys.readouterr().out
    assert plan_main(["--device", "h200", "--model-config", model_config, "--mean-response-length", "99999",
                      "algorithm.adv_estimator=grpo"]) == 2
    assert "--mean-response-length 99999: expected 1 .. " in capsys.readouterr().err


def test_the_docs_hold_the_calibration_table_and_name_every_row_over_25_percent():
    with open(os.path.join(ROOT, "docs", "benchmarks.md"), encoding="utf-8") as f:
        docs = f.read()
    section = docs[docs.index("## Planner time predictions vs measured"):]
    assert calibration.table() in section, "regenerate it: python -m npu_rl.plan.calibration"
    outliers = calibration.outliers()
    assert outliers  # the table is honest about what the model misses
    total = sum(len(row.measured) for row in calibration.ROWS)
    assert f"{total - len(outliers)} of the {total} comparisons meet it, {len(outliers)} do not" in section
    named = section[section.index("Over 25%"):]
    for label, _, _ in outliers:
        assert label in named, label
    for row, predicted in zip(calibration.ROWS, calibration.predictions()):  # the fitted rows stay within the goal
        for phase in row.measured:
            if phase in row.fit:
                assert abs(calibration.error(predicted[phase], row.measured[phase])) <= calibration.LIMIT


def test_docs_show_the_atlas_time_predictions():
    """docs/distributed.md prints the time plans of the seeds' DAPO-32B and a Qwen2.5-7B GRPO on Atlas: still true."""
    from npu_rl.compat.verl.script import read_script
    from npu_rl.compat.verl.translate import translate_overrides
    from npu_rl.config.loader import load_config
    from npu_rl.plan.job import plan_config

    with open(os.path.join(ROOT, "scripts", "run_dapo_qwen2.5_32b_npu.sh"), encoding="utf-8") as f:
        script = read_script(f.read(), env={"HOME": "/home/user", "PWD": "/work"})
    dapo = load_config(translate_overrides(script.overrides), "ppo_trainer")

    def job(name):
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line and not line.startswith("#")]
        return load_config(translate_overrides(lines), "ppo_trainer")

    plans = [plan_config(dapo, "atlas-a3", model_config=os.path.join(DATA, "qwen2.5-32b", "config.json"),
                         mean_response_length=mean) for mean in (None, 5000)]
    plans += [plan_config(job("qwen25_7b_grpo_a3.txt"), "atlas-a3", mean_response_length=mean,
                          model_config=os.path.join(DATA, "qwen2.5-7b", "config.json")) for mean in (None, 1024)]
    plans += [plan_config(job("verl_qwen3_8b_grpo.txt"), device,
                          model_config=os.path.join(DATA, "qwen3-8b", "config.json")) for device in ("atlas-a2", "h100")]
    with open(os.path.join(ROOT, "docs", "distributed.md"), encoding="utf-8") as f:
        docs = f.read()
    for result in plans[:-1]:
        assert result.time.table() in docs and result.time.verdict() in docs, result.time.verdict()
    table = docs[docs.index("| job | devices | predicted tokens/s per device"):]
    for result in plans:  # the comparison table's figures
        assert f"| {result.time.tokens_per_s_per_device:,.0f} (" in table, result.time.verdict()


def test_a_critic_adds_its_forward_and_update(model_config):
    """PPO with GAE: the critic's values and update are phases of the step (a value head, no LM head)."""
    from npu_rl.config.loader import load_config
    from npu_rl.plan.job import plan_config

    config = load_config(["algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=1"], "ppo_trainer")
    time = plan_config(config, "h200", model_config=model_config, critic_model_config=model_config).time
    values, update = time.phase("critic values"), time.phase("critic update")
    assert 0 < values < update and values < time.phase("actor log-probs")  # no logits over the vocabulary


# a device whose compute and HBM are effectively free: what is left is communication and the host link
LINKS_ONLY = timing.DeviceSpeed(peak_tflops=1e12, hbm_tb_s=1e12, link_gb_s=100.0, inter_node_gb_s=10.0,
                                host_link_gb_s=5.0, compiled_decode=False, measured=False)


def test_fsdp_gathers_reduce_scatters_and_offload_copies_by_hand(monkeypatch):
    monkeypatch.setattr(timing, "HOST_LAYER_S", dict.fromkeys(timing.HOST_LAYER_S, 0.0))  # links only: no host floor
    shape = _shape("qwen2.5-0.5b")
    n = shape.num_params
    s = TrainSettings(shard=8, micro_tokens=1000, forward_tokens=1000)
    args = dict(tokens=3000, response_tokens=1000, context=100)  # 3 micro-batches
    # a forward: one bf16 all-gather per micro-batch, 7/8 of the model received over 100 GB/s
    forward = timing.train_phase("f", shape, s, LINKS_ONLY, 8, update=False, **args)
    assert forward.seconds == pytest.approx(3 * n * 2 * 7 / 8 / 100e9, rel=1e-6)
    assert forward.bound == "communication"
    # an update: two gathers (forward, backward) and one fp32 reduce-scatter per micro-batch
    update = timing.train_phase("u", shape, s, LINKS_ONLY, 8, update=True, **args)
    assert update.seconds == pytest.approx(3 * (2 * n * 2 + n * 4) * 7 / 8 / 100e9, rel=1e-6)
    # 16 ranks on nodes of 8: the gathers cross nodes at 10 GB/s
    wide = timing.train_phase("f", shape, replace(s, shard=16), LINKS_ONLY, 8, update=False, **args)
    assert wide.seconds == pytest.approx(3 * n * 2 * 15 / 16 / 10e9, rel=1e-6)
    # param_offload: each gather first copies the rank's fp32 shard from the host at 5 GB/s (not overlapped)
    offloaded = timing.train_phase("f", shape, replace(s, param_offload=True), LINKS_ONLY, 8, update=False, **args)
    assert offloaded.seconds - forward.seconds == pytest.approx(3 * n * 4 / 8 / 5e9, rel=1e-6)


def test_vllm_decodes_in_waves_when_its_kv_cache_is_full(monkeypatch):
    shape, work = _shape("qwen2.5-0.5b"), _work(prompts=64)  # 256 rows of 128 + 256 tokens
    per_row = 384 * kv_bytes_per_token(shape)
    phases = timing.rollout_phases(shape, H200, work, RolloutSettings(), world=1, sp=1,
                                   kv_cache_bytes=100 * per_row, actor_shard=1, engine="vllm")
    decode = next(p for p in phases if p.name == "rollout: decode")
    assert "x 3 waves (KV cache)" in decode.detail  # 100 rows at a time: 256 rows in 3 waves of 85.3
    one_wave, _ = decode_seconds(shape, H200, "vllm", 256 / 3, 128, 256)
    assert decode.seconds == pytest.approx(3 * one_wave)
    roomy = timing.rollout_phases(shape, H200, work, RolloutSettings(), world=1, sp=1, kv_cache_bytes=1e12,
                                  actor_shard=1, engine="vllm")
    assert "waves" not in next(p.detail for p in roomy if p.name == "rollout: decode")
    # vLLM prefills a prompt once for its n samples (prefix cache); the hf engine prefills every row
    prefill = {p.name: p.detail for p in roomy}["rollout: prefill"]
    assert prefill == f"{64 * 128:,} prompt tokens"


# a device of 2 MFLOP/s whose HBM is effectively free: TINY's matmuls take milliseconds, like a small model's launches
SLOW = timing.DeviceSpeed(peak_tflops=2e-6, hbm_tb_s=1e12, link_gb_s=100.0, inter_node_gb_s=10.0,
                          host_link_gb_s=5.0, compiled_decode=False, measured=False)
# 8 tokens, all response, at a mean context of 4: matmuls 2 x 8 x 1,184 = 18,944; attention 4 x 8 x 4 x 8 x 2 layers
# = 2,048; LM head 2 x 8 x 80 = 1,280: 22,272 FLOPs, 22,272 / (2e6 x 0.80) = 13.92 ms a forward on SLOW
TINY_WORK = dict(tokens=8, response_tokens=8, context=4)
TINY_FORWARD_S = 22272 / (2e6 * 0.80)


def test_many_small_micro_batches_are_host_bound_and_one_is_device_bound():
    assert timing.HOST_LAYER_S == {"forward": 1.15e-3, "update": pytest.approx(3.3925e-3),
                                   "update with recompute": pytest.approx(5.359e-3)}  # 1.15 ms x 2.95, x 4.66
    one = timing.train_phase("f", TINY, TrainSettings(forward_tokens=8), SLOW, 8, update=False, **TINY_WORK)
    # one micro-batch: 2 layers x 1.15 ms = 2.3 ms of launches under 13.92 ms on the device
    assert one.seconds == pytest.approx(TINY_FORWARD_S) and one.bound == "compute"
    assert "host" not in one.detail
    # one micro-batch that is still host-bound: nothing to gain from larger micro-batches, and the detail says so
    alone = timing.train_phase("f", TINY, TrainSettings(forward_tokens=8), replace(SLOW, peak_tflops=1.0), 8,
                               update=False, **TINY_WORK)
    assert alone.bound == "host (launches)" and alone.detail.endswith(
        "one micro-batch already: the model is too small to keep the device busy")
    eight = timing.train_phase("f", TINY, TrainSettings(forward_tokens=1), SLOW, 8, update=False, **TINY_WORK)
    # the same work in 8 micro-batches of one token: 8 x 2 layers x 1.15 ms = 18.4 ms > 13.92 ms
    assert eight.seconds == pytest.approx(8 * 2 * 1.15e-3) and eight.bound == "host (launches)"
    assert eight.detail == ("8 micro-batches; host-bound: 16 layer calls x 1.15 ms = 0.0184 s > 0.0139 s on the "
                            "device; larger micro-batches would help")


def test_the_update_floor_counts_its_kind_and_epochs():
    plain = TrainSettings(micro_tokens=1, gradient_checkpointing=False)
    update = timing.train_phase("u", TINY, plain, SLOW, 8, update=True, epochs=2, **TINY_WORK)
    # device: 3 forward-equivalents x 13.92 ms x 2 epochs = 83.52 ms; host: 2 epochs x 8 micro-batches x 2 layers x
    # 1.15 ms x 2.95 = 108.56 ms (the optimizer's 1,352 fp32 parameters x 44 bytes at 1e24 B/s: nothing)
    assert update.seconds == pytest.approx(2 * 8 * 2 * 1.15e-3 * 2.95) and update.bound == "host (launches)"
    assert update.detail.startswith("8 micro-batches x 3 passes x 2 epochs; host-bound: 32 layer calls x 3.39 ms")
    # gradient checkpointing: 4 forward-equivalents on the device (111.36 ms), 4.66 x 1.15 ms a layer on the host
    ckpt = timing.train_phase("u", TINY, replace(plain, gradient_checkpointing=True), SLOW, 8, update=True,
                              epochs=2, **TINY_WORK)
    assert ckpt.seconds == pytest.approx(2 * 8 * 2 * 1.15e-3 * 4.66)
    # one micro-batch of 8 tokens: 2 x 2 x 1.15 ms x 4.66 = 21.4 ms under the 111.36 ms on the device
    whole = timing.train_phase("u", TINY, TrainSettings(micro_tokens=8), SLOW, 8, update=True, epochs=2,
                               **TINY_WORK)
    assert whole.seconds == pytest.approx(2 * 4 * TINY_FORWARD_S) and whole.bound == "compute"


def test_the_vision_towers_blocks_count_in_each_micro_batch_only_where_it_runs_there():
    s = TrainSettings(forward_tokens=1)  # 8 micro-batches of TINY's 2 layers
    each = TowerWork(flops=0.0, blocks=3, per_micro_batch=True, kind="forward")
    # handed pixels in every micro-batch: 8 x (2 layers + 3 blocks) x 1.15 ms = 46 ms
    assert timing.train_phase("f", TINY, s, SLOW, 8, update=False, tower=each, **TINY_WORK).seconds == \
        pytest.approx(8 * 5 * 1.15e-3)
    # encoded once in the pass: 8 x 2 layers + 3 blocks, x 1.15 ms = 21.85 ms
    once = replace(each, per_micro_batch=False)
    assert timing.train_phase("f", TINY, s, SLOW, 8, update=False, tower=once, **TINY_WORK).seconds == \
        pytest.approx(19 * 1.15e-3)
    # the tower's FLOPs are device work of the same pass: 2.24 MFLOP / 1.6 MFLOP/s = 1.4 s, the device's
    heavy = replace(once, flops=2.24e6)
    phase = timing.train_phase("f", TINY, s, SLOW, 8, update=False, tower=heavy, **TINY_WORK)
    assert phase.seconds == pytest.approx(TINY_FORWARD_S + 1.4) and phase.bound == "compute"
    assert "vision 0.0 TFLOP" in phase.detail


def test_which_passes_run_the_tower_in_every_micro_batch():
    vision = VisionShape("qwen2_vl", depth=3, hidden_size=8, intermediate_size=16, num_heads=2, out_hidden_size=8,
                         patch_size=2, temporal_patch_size=1, spatial_merge_size=2, in_channels=1)
    shape = replace(TINY, vision=vision)
    work = _work(images=ImageLoad(images_per_prompt=1, patches_per_image=4, source="test", encode_once=True))

    def runs(actor, work):
        towers = timing.tower_work(shape, actor, work, 1, RolloutSettings())
        return {name: (t.blocks, t.per_micro_batch, t.kind) for name, t in towers.items()}

    # encoded once: the no-grad passes run it once; a trained tower runs (and trains) in every update micro-batch
    assert runs(TrainSettings(), work) == {"actor log-probs": (3, False, "forward"),
                                           "reference log-probs": (3, False, "forward"),
                                           "actor update": (3, True, "update with recompute")}
    # a frozen tower encoded once: once in the update too, without gradient
    assert runs(TrainSettings(freeze_vision=True), work)["actor update"] == (3, False, "forward")
    # handed pixels (transformers < 5.19): every micro-batch of every pass
    per_micro = replace(work, images=replace(work.images, encode_once=False))
    assert runs(TrainSettings(freeze_vision=True), per_micro) == {
        "actor log-probs": (3, True, "forward"), "reference log-probs": (3, True, "forward"),
        "actor update": (3, True, "forward")}


def test_the_towers_elementwise_traffic_is_the_decoders_per_block_by_hand():
    vision = VisionShape("qwen2_vl", depth=3, hidden_size=8, intermediate_size=16, num_heads=2, out_hidden_size=8,
                         patch_size=2, temporal_patch_size=1, spatial_merge_size=2, in_channels=1)
    shape = replace(TINY, vision=vision)
    # 3 blocks x 8 hidden x 110 bytes = 2,640 bytes a patch a forward
    assert timing.tower_bytes_per_patch(shape) == 3 * 8 * timing.ELEMENTWISE_BYTES == 2640
    work = _work(images=ImageLoad(images_per_prompt=1, patches_per_image=4, source="test", encode_once=True))
    towers = timing.tower_work(shape, TrainSettings(), work, 1, RolloutSettings())
    # encoded once: 16 prompts x 4 patches through one forward
    assert towers["actor log-probs"].hbm_bytes == 16 * 4 * 2640
    # a trained tower with checkpointing: 64 rows x 4 patches, 1 + 3 (backward) + 1 (recompute) forwards' traffic
    assert towers["actor update"].hbm_bytes == 64 * 4 * 2640 * 5
    frozen = timing.tower_work(shape, TrainSettings(freeze_vision=True), work, 1, RolloutSettings())
    assert frozen["actor update"].hbm_bytes == 16 * 4 * 2640  # once, no gradient
    # the traffic is device time of its phase: at 1 TB/s over SLOW's 1e12 TB/s it is nothing, at 1e-9 TB/s 1 s a kB
    trickle = replace(SLOW, hbm_tb_s=1e-9)
    tower = TowerWork(flops=0.0, blocks=3, per_micro_batch=False, kind="forward", hbm_bytes=2000.0)
    phase = timing.train_phase("f", TINY, TrainSettings(forward_tokens=8), trickle, 8, update=False, tower=tower,
                               **TINY_WORK)
    no_tower = timing.train_phase("f", TINY, TrainSettings(forward_tokens=8), trickle, 8, update=False,
                                  **TINY_WORK)
    assert phase.seconds - no_tower.seconds == pytest.approx(2.0)
