"""`npu-rl migrate`: the static reading of run scripts, the per-override report and the equivalent command."""

from __future__ import annotations

import os
import shlex

import pytest

from npu_rl.config import verl_keys
from npu_rl.config.migrate import main, migrate
from npu_rl.config.shell_args import read_script
from npu_rl.trainer.preflight import load_checked
from tests.config.test_verl_keys import MUST_PASS
from tests.conftest import REPO_ROOT

SCRIPTS = os.path.join(REPO_ROOT, "tests", "config", "data", "verl_scripts")

BASH = r"""#!/usr/bin/env bash
set -xeuo pipefail
DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' && echo npu || echo gpu)}
max_len=$((1024 * 2))   # a comment
NAME="run ${DEVICE}"
EXTRA=()
case "${DEVICE}" in
    gpu | cuda)
        tp=2
        ;;
    npu)
        tp=4
        EXTRA+=(
            actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096
            "trainer.experiment_name=${NAME}"
        )
        ;;
esac
if [ "${DEVICE}" = npu ] && [ "${tp}" = 4 ]; then
    EXTRA+=(trainer.device=npu)
else
    EXTRA+=(trainer.device=cuda)
fi
PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \
    data.max_prompt_length=${max_len} \
    actor_rollout_ref.rollout.tensor_model_parallel_size=$tp \
    'trainer.logger=["console"]' \
    "${EXTRA[@]}" "$@" 2>&1 | tee log.txt
"""


def test_read_script_evaluates_the_branch_it_is_given():
    npu = read_script(BASH, {"DEVICE": "npu"})
    assert npu.entry_point == "verl.trainer.main_ppo"
    assert npu.overrides == [
        "data.max_prompt_length=2048",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        'trainer.logger=["console"]',
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096",
        "trainer.experiment_name=run npu",
        "trainer.device=npu",
    ]
    assert npu.warnings == []
    gpu = read_script(BASH, {"DEVICE": "gpu"})
    assert gpu.overrides[1] == "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    assert gpu.overrides[-1] == "trainer.device=cuda"


def test_read_script_reports_what_it_cannot_evaluate():
    reading = read_script(BASH, {})  # DEVICE comes from a command substitution: not run
    assert any("command substitutions are not run" in w for w in reading.warnings), reading.warnings
    assert any("cannot decide" in w or "kept as written" in w for w in reading.warnings)


def read_overrides(name):
    with open(os.path.join(SCRIPTS, f"{name}.txt"), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("name", sorted(f[:-4] for f in os.listdir(SCRIPTS) if f.endswith(".txt")))
def test_migrate_accounts_for_every_override_of_real_scripts(name):
    overrides = read_overrides(name)
    rows = migrate(overrides)
    assert [r.override for r in rows] == overrides
    assert not [r for r in rows if r.kind == "unknown"]
    refused = {r.key for r in rows if r.kind in ("refused", "being_built")}
    expected = {
        "prefix_grouper_run_qwen3_8b_fsdp": {"actor_rollout_ref.actor.use_prefix_grouper"},
        "rollout_correction_run_qwen2_5_7b_fsdp": {f"algorithm.rollout_correction.{k}" for k in (
            "rollout_is", "rollout_is_batch_normalize", "bypass_mode", "loss_type")},
    }.get(name, set())
    landed = {key for key in expected if verl_keys.classify(key).kind == "implemented"}  # features added since
    assert expected - landed <= refused
    if name in MUST_PASS:
        assert refused == set()
    for row in rows:
        if row.kind in ("refused", "being_built"):
            assert "; instead: " in row.detail, row
    for row in rows:
        if row.kind == "alias":
            assert row.rewritten.split("=", 1)[0] == row.detail[3:]


def test_migrate_flags_ascend_differences():
    rows = migrate(["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.use_fused_kernels=True",
                    "data.train_batch_size=8"])
    assert "vLLM-Ascend" in rows[0].ascend and "triton-ascend" in rows[1].ascend and rows[2].ascend == ""


def test_migrate_cli_on_the_seeds_ppo_script_writes_a_command_that_loads(capsys, tmp_path, tiny_model_dir):
    script = os.path.join(REPO_ROOT, "scripts", "run_ppo_gsm8k_single_card.sh")
    data = tmp_path / "gsm8k"
    data.mkdir()
    for name in ("train.parquet", "test.parquet"):
        (data / name).write_bytes(b"")
    code = main([script, "--env", f"MODEL_PATH={tiny_model_dir}", "--env", f"DATA_DIR={data}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "# 24 supported" in out
    command = out.split("# the equivalent npu-rl command:\n", 1)[1]
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:5] == ["python3", "-m", "npu_rl.trainer.main_ppo", "--config-name", "ppo_trainer"]
    config = load_checked(words[5:], "ppo_trainer", check_device=False)
    assert config.critic.model.path == tiny_model_dir and config.trainer.total_epochs == 15


def test_migrate_cli_refusal_exit_code_and_overrides_file(capsys, tmp_path):
    listing = tmp_path / "overrides.txt"
    listing.write_text("# a comment\ncritic.fsdp.param_offload=True\nactor_rollout_ref.actor.use_prefix_grouper=True\n")
    assert main(["--overrides-file", str(listing)]) == 1
    out = capsys.readouterr().out
    assert "mapped     critic.fsdp.param_offload=True" in out and "-> critic.model.fsdp_config.param_offload" in out
    assert "#   actor_rollout_ref.actor.use_prefix_grouper=True    # refused" in out
    assert main(["--overrides", "data.image_key=images"]) == 0
    assert "no effect  data.image_key=images" in capsys.readouterr().out
    assert main([]) == 2


def test_dapo_entry_point_brings_its_defaults(capsys, tmp_path):
    script = tmp_path / "run_dapo.sh"
    script.write_text("python3 -m recipe.dapo.main_dapo \\\n    trainer.project_name=mine \\\n"
                      "    reward_model.overlong_buffer.enable=False\n")
    assert main([str(script)]) == 0
    out = capsys.readouterr().out
    assert "added: reward_model.reward_manager=dapo" in out
    assert "    reward_model.reward_manager=dapo \\" in out and "verl-dapo" not in out.split("# warning")[-1].split(
        "\n", 1)[1]


def test_read_script_arrays_with_comments_quoted_blocks_and_positional_defaults():
    script = '''
max_prompt_length=$((1024 * 2))
ENGINE=${1:-vllm}
ACTOR=(
    # fsdp
    actor_rollout_ref.actor.fsdp_config.param_offload=True   # offload
    actor_rollout_ref.rollout.max_num_batched_tokens=$((max_prompt_length + 1024))
)
MODEL_CONFIG="
    actor_rollout_ref.model.path=/m \\
    actor_rollout_ref.rollout.name=$ENGINE"
python -m verl.trainer.main_ppo "${ACTOR[@]}" $MODEL_CONFIG "$@"
'''
    assert read_script(script).overrides == [
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
        "actor_rollout_ref.rollout.max_num_batched_tokens=3072",
        "actor_rollout_ref.model.path=/m",
        "actor_rollout_ref.rollout.name=vllm",
    ]
