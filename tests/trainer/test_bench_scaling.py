"""``npu-rl bench trainer``'s run plan and scaling figures (hand-computed)."""

from __future__ import annotations

import pytest

from npu_rl.commands.bench_trainer import plan_runs, scaling_figures
from npu_rl.commands.bench_profile import categorize


def test_plan_has_the_single_device_baseline_first_and_weak_doubles_the_prompts():
    runs = plan_runs(["fused"], [2, 1], "both", 16)
    assert [(r["label"], r["devices"], r["prompts"]) for r in runs] == [
        ("fused", 1, 16), ("fused x2 strong", 2, 16), ("fused x2 weak", 2, 32)]
    assert [r["kind"] for r in plan_runs(["naive", "packed"], [1, 4], "weak", 8)] == ["single", "weak"] * 2
    with pytest.raises(SystemExit, match="unknown mode"):
        plan_runs(["turbo"], [1], "strong", 8)


def test_scaling_against_the_one_device_run():
    results = {"runs": [
        {"mode": "fused", "devices": 1, "kind": "single", "values": {"perf/throughput": 1000.0, "timing_s/step": 6.0}},
        {"mode": "fused", "devices": 2, "kind": "strong", "values": {"perf/throughput": 1500.0, "timing_s/step": 4.0}},
        {"mode": "fused", "devices": 2, "kind": "weak", "values": {"perf/throughput": 950.0, "timing_s/step": 6.3}},  # per device
        {"mode": "fused", "devices": 2, "kind": "weak", "failed": True},
    ]}
    scaling_figures(results)
    strong, weak = results["runs"][1]["scaling"], results["runs"][2]["scaling"]
    assert strong == {"step_speedup": 1.5, "strong_efficiency": 0.75}
    assert weak == pytest.approx({"tokens_per_s_ratio": 1.9, "weak_efficiency": 0.95})
    assert "scaling" not in results["runs"][0] and "scaling" not in results["runs"][3]


def test_profile_categories():
    assert categorize("nvjet_sm90_tst_192x192_64x4_1x2_h_bz_coopB_TNN") == "matmul"
    assert categorize("void pytorch_flash::flash_fwd_kernel<...>") == "attention"
    assert categorize("ncclDevKernel_AllGather_RING_LL") == "communication"
    assert categorize("multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>>") == "optimizer"
    assert categorize("vectorized_elementwise_kernel<silu_kernel>") == "elementwise / norm / other"


def test_prompt_lengths_spread_between_the_two_bounds(tmp_path):
    import argparse

    from npu_rl.data.io import read_rows
    from npu_rl.models.synthetic import char_tokenizer
    from npu_rl.commands.bench_trainer import _prompt_data

    tokenizer = char_tokenizer()

    def lengths(minimum):
        args = argparse.Namespace(prompt_length=64, min_prompt_length=minimum, steps=1)
        rows = read_rows(_prompt_data(args, str(tmp_path / str(minimum)), prompts=4))
        return [len(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, return_dict=True)["input_ids"])
                for r in rows]

    assert lengths(None) == [64] * 4
    assert lengths(40) == [40, 48, 56, 64]
    with pytest.raises(SystemExit, match="min-prompt-length"):
        lengths(2)
