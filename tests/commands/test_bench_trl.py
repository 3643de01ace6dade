"""`npu-rl bench trl`: one recipe mapped onto both sides (precision, micro-batches, no checkpoint, held-out
accuracy), our side's figures read from its metrics, the report. No TRL needed: TRL's side is checked by the names of
its config (TRL 1.16's GRPOConfig fields, read from its wheel, and transformers' TrainingArguments) and by its
held-out scoring on a fake model."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import pytest
import torch
from transformers import TrainingArguments

from npu_rl.commands import bench_trl
from npu_rl.commands.bench_trl_side import grpo_config_kwargs, heldout_accuracy
from npu_rl.trainer.preflight import load_checked

# GRPOConfig's own fields in TRL 1.16.0 that the bench sets (trl/trainer/grpo_config.py); the others are
# transformers' TrainingArguments fields
TRL_116_GRPO_FIELDS = {"beta", "generation_kwargs", "learning_rate", "max_completion_length", "num_generations",
                       "num_iterations", "temperature"}


def _args(*argv):
    return bench_trl.parser().parse_args(list(argv))


FILES = {"model": "/m", "train": "/w/train.jsonl", "train_parquet": "/w/train.parquet",
         "heldout": "/w/heldout.jsonl", "heldout_parquet": "/w/heldout.parquet"}


def test_micro_batch_maps_to_the_same_split_on_both_sides():
    args = _args("--prompts", "4", "--n", "8", "--micro-batch", "8")
    assert bench_trl.micro_batching(args) == (8, 4)  # 32 completions: 4 micro-batches of 8, one update
    settings = bench_trl.trl_settings(args)
    kwargs = grpo_config_kwargs(settings, "/o", on_accelerator=True)
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == 32
    assert kwargs["per_device_train_batch_size"] == 8 and kwargs["num_generations"] == 8
    overrides = bench_trl.our_overrides(args, FILES, "/r")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8" in overrides
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=4" in overrides  # one mini-batch: all 4 prompts x 8
    assert bench_trl.micro_batching(_args("--prompts", "4", "--n", "8")) == (32, 1)  # default: the whole batch


@pytest.mark.parametrize("micro", ["5", "0", "64"])
def test_a_micro_batch_that_does_not_divide_the_batch_is_refused(micro, capsys):
    assert bench_trl.main(["--prompts", "4", "--n", "8", "--micro-batch", micro, "--sides", "ours"]) == 2
    assert f"--micro-batch {micro} must divide the batch of --prompts x --n = 32" in capsys.readouterr().err


@pytest.mark.parametrize("precision, master, compute, trl_dtype, trl_bf16", [
    ("bf16", "bf16", "bf16", "bfloat16", True), ("mixed", "fp32", "bf16", "float32", True),
    ("fp32", "fp32", "fp32", "float32", False)])
def test_our_overrides_load_as_the_recipe_says(precision, master, compute, trl_dtype, trl_bf16):
    args = _args("--precision", precision, "--steps", "3", "--micro-batch", "16", "--engine", "hf")
    config = load_checked(bench_trl.our_overrides(args, FILES, "/tmp/run"), "quickstart", check_paths=False,
                          check_device=False)
    actor, trainer = config.actor_rollout_ref.actor, config.trainer
    assert (actor.fsdp_config.model_dtype, actor.fsdp_config.mixed_precision.param_dtype) == (master, compute)
    assert actor.ppo_micro_batch_size_per_gpu == 16 and actor.ppo_epochs == 1 and not actor.use_kl_loss
    assert config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 16
    # nothing written at the end but the metrics; validated before the first step and after the last
    assert trainer.save_freq == -1 and trainer.draw_curves is False and trainer.save_on_interrupt is False
    assert trainer.val_before_train and trainer.test_freq == 3
    assert config.data.val_files == FILES["heldout_parquet"] and config.data.val_batch_size is None
    assert config.actor_rollout_ref.rollout.val_kwargs.do_sample is False
    settings = bench_trl.trl_settings(args)
    assert (settings["load_dtype"], settings["bf16"]) == (trl_dtype, trl_bf16)


def test_shape_models_have_no_heldout_set():
    args = _args("--model", "shape:qwen2.5-0.5b", "--prompt-length", "64")
    config = load_checked(bench_trl.our_overrides(args, FILES, "/tmp/run"), "quickstart", check_paths=False,
                          check_device=False)
    assert not config.trainer.val_before_train and config.trainer.test_freq == -1
    assert config.data.max_prompt_length == 96
    assert bench_trl.trl_settings(args)["heldout"] is False


# GRPOConfig's vLLM fields in TRL 1.16.0 that the bench sets with --engine vllm (trl/trainer/grpo_config.py)
TRL_116_VLLM_FIELDS = {"use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode",
                       "vllm_max_model_length"}


def test_trl_runs_its_vllm_colocate_mode_when_ours_runs_vllm():
    args = _args("--model", "shape:qwen2.5-0.5b", "--prompt-length", "64", "--response-length", "128",
                 "--ignore-eos", "--gpu-memory-utilization", "0.4", "--trl-engine", "vllm")
    kwargs = grpo_config_kwargs(bench_trl.trl_settings(args), "/o", on_accelerator=True)
    training_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(kwargs) - training_fields == (TRL_116_GRPO_FIELDS | TRL_116_VLLM_FIELDS) - {"learning_rate"}
    assert kwargs["use_vllm"] and kwargs["vllm_mode"] == "colocate" and kwargs["vllm_enable_sleep_mode"]
    assert kwargs["vllm_gpu_memory_utilization"] == 0.4 and kwargs["vllm_max_model_length"] == 64 + 32 + 128
    assert kwargs["generation_kwargs"] == {"ignore_eos": True}  # vLLM's SamplingParams name
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.4" in bench_trl.our_overrides(args, FILES, "/r")
    assert "use_vllm" not in grpo_config_kwargs(bench_trl.trl_settings(_args("--trl-engine", "hf")), "/o", True)
    # the default follows --engine on an accelerator, and is generate on a CPU
    accelerator = bench_trl.get_backend().is_accelerator
    assert bench_trl.trl_settings(_args())["use_vllm"] is accelerator
    assert "use_vllm" not in grpo_config_kwargs(bench_trl.trl_settings(_args("--engine", "hf")), "/o", True)


def test_trl_counts_each_steps_tokens_from_its_cumulative_log():
    from npu_rl.commands.bench_trl_side import tokens_per_step

    history = [{"loss": 0.1, "num_tokens": 100.0}, {"train_runtime": 3.0}, {"num_tokens": 250.0},
               {"num_tokens": 420.0}]
    assert tokens_per_step(history) == [100.0, 150.0, 170.0]


def test_trl_config_names_are_trl_116s_and_build_training_arguments_off_an_accelerator():
    settings = bench_trl.trl_settings(_args("--precision", "mixed", "--micro-batch", "16", "--ignore-eos",
                                            "--engine", "hf"))
    kwargs = grpo_config_kwargs(settings, "/tmp/out", on_accelerator=False)
    training_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(kwargs) - training_fields == TRL_116_GRPO_FIELDS - {"learning_rate"}
    assert kwargs["save_strategy"] == "no" and kwargs["beta"] == 0.0 and kwargs["num_iterations"] == 1
    assert kwargs["generation_kwargs"] == {"min_new_tokens": 24}
    # transformers refuses bf16 on a machine without a bf16 GPU unless use_cpu: the bench's CPU runs need it
    trainer_args = TrainingArguments(**{k: v for k, v in kwargs.items() if k in training_fields})
    assert trainer_args.bf16 and trainer_args.use_cpu and trainer_args.gradient_accumulation_steps == 2


class _FakeModel(torch.nn.Module):
    """Answers each prompt with the text it is given (after the prompt), as generate returns prompt + answer."""

    def __init__(self, tokenizer, answers):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer, self.answers, self.seen = tokenizer, answers, {}

    def generate(self, input_ids, attention_mask, **kwargs):
        self.seen = kwargs
        answers = [self.tokenizer(a + "<|im_end|>", add_special_tokens=False)["input_ids"] for a in self.answers]
        width = max(len(a) for a in answers) + 2
        pad = self.tokenizer.pad_token_id
        tails = torch.tensor([a + [pad] * (width - len(a)) for a in answers])
        return torch.cat([input_ids, tails], dim=1)


def test_heldout_accuracy_is_greedy_and_scored_by_the_arith_rule(tiny_tokenizer):
    rows = [{"prompt": [{"role": "user", "content": "What is 2+3?"}], "answer": "5"},
            {"prompt": [{"role": "user", "content": "What is 4+4?"}], "answer": "8"}]
    model = _FakeModel(tiny_tokenizer, ["5", "9"])
    assert heldout_accuracy(model, tiny_tokenizer, rows, max_new_tokens=7, autocast_bf16=False) == 0.5
    assert model.seen["do_sample"] is False and model.seen["max_new_tokens"] == 7
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_end|>") in model.seen["eos_token_id"]


def test_our_figures_come_from_the_metrics_file(tmp_path):
    logs = tmp_path / "run" / "logs" / "20260101-000000"
    logs.mkdir(parents=True)
    rows = [{"step": 0, "time": 1010.0, "val-core/arith/acc/mean@1": 0.6, "timing_s/testing": 2.0},
            {"step": 1, "time": 1020.0, "timing_s/step": 5.0},
            {"step": 2, "time": 1028.0, "timing_s/step": 3.0, "val-core/arith/acc/mean@1": 0.9,
             "timing_s/testing": 1.5}]
    (logs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = bench_trl.read_our_run(str(tmp_path / "run"), spawned=1000.0)
    assert figures["startup_s"] == 15.0  # step 1 was logged at 1020 after 5 s of step: it began 15 s after spawn
    assert (figures["heldout_before"], figures["heldout_after"]) == (0.6, 0.9)
    assert figures["val_s"] == 3.5 and figures["step_times_s"] == [5.0, 3.0]


def test_the_report_labels_cold_and_warm_runs_and_gives_the_ratios():
    def run(index, side, wall, step):
        figures = {"step_times_s": [9.0, step, step, step], "startup_s": wall / 2, "val_s": 1.0,
                   "heldout_before": 0.6, "heldout_after": 0.9}
        return {"run": index, "cache": "cold" if index == 1 else "warm", **bench_trl.summarise(side, wall, figures)}

    runs = [run(1, "trl", 40.0, 1.0), run(1, "ours", 60.0, 0.8), run(2, "trl", 30.0, 1.0), run(2, "ours", 24.0, 0.5)]
    ratios = bench_trl.ratios(runs)
    assert [(q["run"], q["cache"]) for q in ratios] == [(1, "cold"), (2, "warm")]
    assert math.isclose(ratios[0]["wall_s"], 1.5) and math.isclose(ratios[1]["steady_step_s"], 0.5)
    text = bench_trl.render(runs, _args("--repeat", "2"))
    assert "| 1 (cold) | ours | 60.0 | 30.0 | 11.4 | 9.00 | 0.80 | 1.0 | 0.60 -> 0.90 |" in text
    assert "ours / trl, run 2 (warm): wall 0.80x, start-up 0.80x, steady step 0.50x" in text
    assert "every row of builtin://arith/test (25)" in text


def test_the_heldout_set_the_report_names_has_25_rows():
    assert len(bench_trl._task_rows(bench_trl.HELDOUT_SET)) == 25  # 1-digit addition: a quarter of 100 problems


def test_a_failed_side_keeps_the_work_folder_with_its_output(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_trl.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(bench_trl, "prepare_inputs", lambda args, work: dict(FILES))
    monkeypatch.setattr(bench_trl, "side_command", lambda *a: [sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
    assert bench_trl.main(["--sides", "ours"]) == 1
    work = next(tmp_path.iterdir())
    assert (work / "ours-1" / "output.log").read_text().strip() == "boom"
    assert "the ours side failed (exit 3)" in capsys.readouterr().err
