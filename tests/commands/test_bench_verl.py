"""``npu-rl bench verl``: the one job both sides run, and how each side's metrics file is read."""

import json
import os

import pytest

from npu_rl.commands import bench_verl
from npu_rl.commands.bench_trl_side import grpo_config_kwargs
from npu_rl.config.loader import load_config
from npu_rl.trainer.main_ppo import translate_overrides
from npu_rl.trainer.preflight import check


def _args(*argv):
    return bench_verl._parser().parse_args(list(argv))


def _kv(overrides):
    return dict(o.lstrip("+").split("=", 1) for o in overrides)


def test_the_job_is_one_override_list_both_configs_accept(tmp_path):
    args = _args("--model", "shape:tiny", "--prompts", "4", "--n", "2", "--steps", "3", "--prompt-length", "16",
                 "--response-length", "8", "--micro-batch", "2", "--ignore-eos", "--padding", "padded")
    overrides = bench_verl.prepare(args, str(tmp_path))
    kv = _kv(overrides)
    assert kv["data.train_batch_size"] == "4" and kv["actor_rollout_ref.actor.ppo_mini_batch_size"] == "4"
    assert kv["actor_rollout_ref.rollout.n"] == "2" and kv["data.max_response_length"] == "8"
    assert kv["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "2"
    assert kv["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == "2"
    assert kv["trainer.save_freq"] == "-1" and kv["actor_rollout_ref.rollout.ignore_eos"] == "True"
    assert kv["actor_rollout_ref.model.use_remove_padding"] == "False"
    assert kv["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    # the data has P x steps rows, each prompt a chat message of prompt-length characters
    import pandas as pd

    rows = pd.read_parquet(kv["data.train_files"])
    assert len(rows) == 12 and len(rows.iloc[0]["prompt"][0]["content"]) == 16
    # ours reads verl's keys (the verl side is checked against verl's own config in tests/e2e when verl is installed)
    config = load_config(translate_overrides(overrides, []), "ppo_trainer", None)
    check(config, check_paths=True, check_device=False)
    assert config.actor_rollout_ref.model.use_remove_padding is False
    assert config.custom_reward_function.path == os.path.join(str(tmp_path), "reward.py")


def test_reward_file_scores_with_verl_signature(tmp_path):
    bench_verl.prepare(_args("--model", "shape:tiny", "--prompts", "1", "--steps", "1", "--prompt-length", "4"),
                       str(tmp_path))
    namespace: dict = {}
    exec(compile(open(tmp_path / "reward.py").read(), "reward.py", "exec"), namespace)  # our own generated file
    assert namespace["compute_score"]("arith", "the answer is 12", "12") == 1.0
    assert namespace["compute_score"]("arith", "the answer is 13", "12") == 0.0
    assert namespace["compute_score"]("bench_random", "ab", "0") == 0.0


@pytest.mark.parametrize("padding,packed", [("packed", True), ("padded", False)])
def test_padding_recipe(padding, packed):
    assert ("actor_rollout_ref.model.use_remove_padding=True" in bench_verl.padding_overrides(padding)) is packed


def test_side_commands_keep_caches_apart(tmp_path):
    verl_cmd, verl_env = bench_verl.side_command("verl", ["a=1"], str(tmp_path / "verl-run1"))
    ours_cmd, ours_env = bench_verl.side_command("ours", ["a=1"], str(tmp_path / "ours-run1"))
    assert verl_cmd[1:3] == ["-m", "verl.trainer.main_ppo"] and ours_cmd[1:3] == ["-m", "npu_rl.trainer.main_ppo"]
    assert verl_env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "verl-run1" / "metrics.jsonl")
    assert verl_env["VLLM_CACHE_ROOT"] != ours_env["VLLM_CACHE_ROOT"]
    assert "a=1" in verl_cmd and "a=1" in ours_cmd


def _write(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows) + "\n")


def test_verl_metrics_file_and_summary(tmp_path):
    # verl's FileLogger writes {"step": N, "data": {...}}; validation before training at step 0
    steps = [{"step": 0, "data": {"val-core/arith/acc/mean@1": 0.25}}]
    for i, t in enumerate([9.0, 2.0, 3.0, 4.0], 1):
        steps.append({"step": i, "data": {"timing_s/step": t, "timing_s/gen": t / 2, "timing_s/update_weights": 0.5,
                                          "perf/throughput": 100.0 * i, "actor/perf/max_memory_allocated_gb": 10.0 + i,
                                          "perf/max_memory_allocated_gb": 99.0}})
    steps[-1]["data"]["val-core/arith/acc/mean@1"] = 0.75
    _write(str(tmp_path / "run" / "metrics.jsonl"), steps)
    s = bench_verl.summarize("verl", bench_verl.read_metrics("verl", str(tmp_path / "run")), wall_s=60.0)
    assert s["num_steps"] == 4 and s["first_step_s"] == 9.0 and s["steady_step_s"] == 3.0  # median of 2, 3, 4
    # verl logs its actor worker's peak as actor/perf/... (its vLLM server is another process)
    assert s["tokens_per_s_per_gpu"] == 300.0 and s["peak_memory_gb"] == 14.0
    assert s["peak_memory_scope"] == bench_verl.PEAK_SCOPE["verl"]
    assert s["phases_s"] == {"gen": 1.5, "weight_sync": 0.5}
    assert s["held_out_before"] == {"arith/acc/mean@1": 0.25} and s["held_out_after"] == {"arith/acc/mean@1": 0.75}


def test_our_metrics_file_uses_our_sync_name(tmp_path):
    rows = [{"step": i, "timing_s/step": 1.0, "timing_s/rollout_update_weights": 0.2, "timing_s/update_weights": 9.0}
            for i in (1, 2)]
    _write(str(tmp_path / "r" / "sub" / "metrics.jsonl"), rows)
    s = bench_verl.summarize("ours", bench_verl.read_metrics("ours", str(tmp_path / "r")), wall_s=1.0)
    assert s["phases_s"]["weight_sync"] == 0.2 and "held_out_after" not in s


def test_bad_metrics_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="verl side wrote no metrics.jsonl"):
        bench_verl.read_metrics("verl", str(tmp_path))
    _write(str(tmp_path / "metrics.jsonl"), [{"step": 1, "timing_s/step": 1.0}])
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: expected verl's"):
        bench_verl.read_metrics("verl", str(tmp_path))


def test_render_ratio_pairs_cold_with_cold():
    base = {"first_step_s": 1.0, "phases_s": {}, "num_steps": 2}
    results = [{**base, "side": "verl", "warm": False, "wall_s": 100.0, "steady_step_s": 2.0,
                "tokens_per_s_per_gpu": 1000.0, "peak_memory_gb": 40.0},
               {**base, "side": "ours", "warm": False, "wall_s": 50.0, "steady_step_s": 1.0,
                "tokens_per_s_per_gpu": 2000.0, "peak_memory_gb": 30.0}]
    text = bench_verl.render(results, _args())
    assert "ours / verl (cold): wall 0.50x, steady step 0.50x, tokens/s/GPU 2.00x, peak memory 0.75x" in text
    assert "(warm)" not in text


def test_render_peaks_of_different_processes_get_no_ratio():
    base = {"first_step_s": 1.0, "phases_s": {}, "num_steps": 2, "warm": False, "wall_s": 1.0, "steady_step_s": 1.0,
            "tokens_per_s_per_gpu": 1.0}
    results = [{**base, "side": "verl", "peak_memory_gb": 12.0, "peak_memory_scope": bench_verl.PEAK_SCOPE["verl"]},
               {**base, "side": "ours", "peak_memory_gb": 51.0, "peak_memory_scope": bench_verl.PEAK_SCOPE["ours"]}]
    text = bench_verl.render(results, _args())
    assert "peak memory not comparable" in text and "0.24x" not in text
    assert "verl: actor worker, vLLM's server process apart" in text


def test_missing_verl_and_bad_sides_exit_2(monkeypatch, capsys, tmp_path):
    assert bench_verl.main(["--sides", "tlr"]) == 2
    assert "--sides takes verl, ours, trl" in capsys.readouterr().err
    assert bench_verl.main(["--sides", "trl", "--trl-site", str(tmp_path)]) == 2  # no trl/ package in that folder
    assert f"TRL is not installed in --trl-site {tmp_path}" in capsys.readouterr().err
    (tmp_path / "trl").mkdir()
    assert bench_verl.main(["--sides", "trl", "--trl-site", str(tmp_path), "--prompts", "3", "--n", "3"]) == 2
    assert "--micro-batch 8 must divide --prompts x --n = 9" in capsys.readouterr().err
    monkeypatch.setattr(bench_verl.importlib.util, "find_spec", lambda name: None)
    assert bench_verl.main([]) == 2
    assert "verl is not installed" in capsys.readouterr().err


def test_a_folder_keeps_runs_of_the_same_job_across_invocations(tmp_path, monkeypatch, capsys):
    """The sides of a long row run in separate invocations (device calls); the report joins them, runs count on."""
    calls = []

    def fake_run(side, overrides, folder, run, timeout, trl=None):
        calls.append((side, run))
        return {"side": side, "run": run, "warm": run > 1, "wall_s": 10.0 * run, "first_step_s": 1.0,
                "steady_step_s": 1.0, "tokens_per_s_per_gpu": 100.0, "peak_memory_gb": 1.0, "phases_s": {},
                "num_steps": 1}

    monkeypatch.setattr(bench_verl, "run_side", fake_run)
    job = ["--model", "shape:tiny", "--prompts", "1", "--steps", "1", "--prompt-length", "4", "--dir", str(tmp_path)]
    assert bench_verl.main([*job, "--sides", "ours"]) == 0
    assert bench_verl.main([*job, "--sides", "ours", "--out", str(tmp_path / "o.json")]) == 0
    assert calls == [("ours", 1), ("ours", 2)]  # the second invocation's run is the warm one
    out = json.loads((tmp_path / "o.json").read_text())
    assert [(r["side"], r["run"], r["warm"]) for r in out["results"]] == [("ours", 1, False), ("ours", 2, True)]
    assert "1 earlier run(s) of this job" in capsys.readouterr().out
    # another job in the same folder starts over
    assert bench_verl.main([*job, "--sides", "ours", "--lr", "3e-6", "--out", str(tmp_path / "o2.json")]) == 0
    assert [r["run"] for r in json.loads((tmp_path / "o2.json").read_text())["results"]] == [1]
    # a damaged record is named before anything runs
    with open(tmp_path / "results.jsonl", "a") as fh:
        fh.write("{not json\n")
    assert bench_verl.main([*job, "--sides", "ours"]) == 2
    assert "results.jsonl:4: not a JSON line" in capsys.readouterr().err
    assert len(calls) == 3


def test_the_trl_side_runs_the_same_job(tmp_path):
    """TRL's side: the same model folder, rows (as chat messages + answer), sizes, learning rate, micro-batches and
    vLLM memory share; its colocate mode with sleep; only its interpreter sees --trl-site."""
    args = _args("--model", "shape:tiny", "--prompts", "2", "--n", "4", "--steps", "1", "--prompt-length", "4",
                 "--response-length", "16", "--micro-batch", "4", "--ignore-eos", "--gpu-memory-utilization", "0.3",
                 "--lr", "3e-6")
    overrides = bench_verl.prepare(args, str(tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    parquet = bench_verl.read_rows(str(tmp_path / "train.parquet"))
    assert [r["prompt"] for r in rows] == [[dict(m) for m in r["prompt"]] for r in parquet] and len(rows) == 2
    settings = bench_verl.trl_settings(args, max_prompt=36)
    kwargs = grpo_config_kwargs(settings, "/o", on_accelerator=True)
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == 8  # 2 prompts x 4
    assert kwargs["num_generations"] == 4 and kwargs["learning_rate"] == 3e-6 and kwargs["max_steps"] == 1
    assert kwargs["use_vllm"] and kwargs["vllm_mode"] == "colocate" and kwargs["vllm_gpu_memory_utilization"] == 0.3
    assert kwargs["vllm_max_model_length"] == 36 + 16 and kwargs["generation_kwargs"] == {"ignore_eos": True}
    command, env = bench_verl.side_command("trl", overrides, str(tmp_path / "trl-run1"),
                                           {"settings": settings, "site": "/opt/trl"})
    assert command[1:3] == ["-m", "npu_rl.commands.bench_trl_side"]
    files = json.loads(command[command.index("--files") + 1])
    assert files["model"] == str(tmp_path / "model") and files["train"] == str(tmp_path / "train.jsonl")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == "/opt/trl"
    assert "PYTHONPATH" not in bench_verl.side_command("verl", overrides, str(tmp_path / "verl-run1"))[1]


def test_trl_figures_in_the_reports_terms():
    result = {"step_times_s": [4.0, 2.0, 1.0], "tokens_per_step": [400.0, 400.0, 300.0], "peak_memory_gb": 12.0,
              "heldout_before": 0.5, "heldout_after": 0.75}
    out = bench_verl.summarize_trl(result, wall_s=30.0)
    assert out["first_step_s"] == 4.0 and out["steady_step_s"] == 1.5  # the median after the first
    assert out["tokens_per_s_per_gpu"] == 250.0  # median of 400 / 2 and 300 / 1
    assert out["held_out_before"] == {"acc/mean@1": 0.5} and out["held_out_after"] == {"acc/mean@1": 0.75}
    base = {"first_step_s": 1.0, "phases_s": {}, "num_steps": 2, "warm": False}
    text = bench_verl.render([{**base, "side": "ours", "wall_s": 15.0, "steady_step_s": 0.75,
                               "tokens_per_s_per_gpu": 500.0, "peak_memory_gb": 6.0}, {**out, "warm": False}],
                             _args())
    assert "ours / trl (cold): wall 0.50x, steady step 0.50x, tokens/s/GPU 2.00x, peak memory not comparable" in text
    assert "0.500 -> 0.750" in text


def test_a_failed_sides_first_error_is_named_not_only_its_last_words():
    """verl 0.9.1 on the H100 (2026-12-07): every rollout failed in its agent loop, and the run ended on a
    consequence; the warnings about engines it lacks come first and are not errors."""
    log = "\n".join([
        "(TaskRunnerV1 pid=7376) /tmp/site/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not "
        "available: ModuleNotFoundError(\"No module named 'torchtitan'\")",
        "(AgentLoopWorkerTQ pid=8802) ERROR:2026-12-07 08:03:38,534:Error in _run_prompt for uid=cf70",
        "(AgentLoopWorkerTQ pid=8802) Traceback (most recent call last):",
        "(AgentLoopWorkerTQ pid=8802) ValueError: Expected Qwen newline to tokenize to one token, got []",
        "RuntimeError: Sync replay buffer selected terminal groups with no materializable trajectories.",
    ])
    assert bench_verl.first_error(log) == "ValueError: Expected Qwen newline to tokenize to one token, got []"
    assert bench_verl.first_error("all fine\nUserWarning: x\n") is None
