"""`npu-rl migrate`: the reading of run scripts (restricted bash, recording stubs), the per-override report, the
loader's checks and the equivalent command."""

from __future__ import annotations

import os
import shlex

import pytest

from npu_rl.commands.migrate import main
from npu_rl.compat.verl import keys as verl_keys
from npu_rl.compat.verl import script as script_module
from npu_rl.compat.verl.migrate import migrate
from npu_rl.compat.verl.script import ScriptError, read_script
from npu_rl.trainer.main_ppo import main as train_main
from tests.config.test_verl_keys import MUST_PASS, header
from tests.conftest import REPO_ROOT
from tests.helpers import write_verl_parquet

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
    assert npu.warnings == ["not run (migrate runs no command but the trainer call; each failed as a missing program "
                            "would, with no output): tee (line 28)"]
    gpu = read_script(BASH, {"DEVICE": "gpu"})
    assert gpu.overrides[1] == "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    assert gpu.overrides[-1] == "trainer.device=cuda"


def test_read_script_reports_what_it_cannot_evaluate():
    reading = read_script(BASH, {})  # DEVICE comes from `python3 -c 'import torch_npu'`: not run, so it fails
    assert "python3 (line 3)" in reading.warnings[0], reading.warnings
    assert reading.overrides[-1] == "trainer.device=cuda"  # the script's own fallback (|| echo gpu)


def read_overrides(name):
    with open(os.path.join(SCRIPTS, f"{name}.txt"), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("name", sorted(f[:-4] for f in os.listdir(SCRIPTS) if f.endswith(".txt")))
def test_migrate_accounts_for_every_override_of_real_scripts(name):
    overrides = read_overrides(name)
    rows = migrate(overrides)
    assert [r.override for r in rows] == overrides
    trainer = header(name, "trainer")
    if trainer is not None and trainer.startswith("recipe."):
        return  # a recipe's own trainer: its keys are that recipe's (migrate refuses the trainer, test_verl_keys)
    assert not [r for r in rows if r.kind == "unknown"]
    refused = {r.key for r in rows if r.kind == "refused"}
    expected = {
        "prefix_grouper_run_qwen3_8b_fsdp": {"actor_rollout_ref.actor.use_prefix_grouper"},
        "rollout_correction_run_qwen2_5_7b_fsdp": {f"algorithm.rollout_correction.{k}" for k in (
            "rollout_is", "rollout_is_batch_normalize", "bypass_mode", "loss_type")},
        "grpo_trainer_run_gpt_oss_20b_fsdp": {"actor_rollout_ref.rollout.name"},  # sglang
        "grpo_trainer_run_qwen3_5_27b_fsdp_turbo": {"actor_rollout_ref.actor.strategy"},  # fsdp_turbo
    }.get(name, set())
    landed = {key for key in expected if verl_keys.classify(key).kind == "implemented"}  # features added since
    assert expected - landed <= refused
    if name in MUST_PASS:
        assert refused == set()
    for row in rows:
        if row.kind == "refused":
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
        write_verl_parquet(data / name)
    code = main([script, "--env", f"MODEL_PATH={tiny_model_dir}", "--env", f"DATA_DIR={data}",
                 "--env", f"HOME={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "# 24 supported" in out and "# the kept overrides load and pass the checks of `--cfg job`" in out
    words = printed_command(out)
    assert words[:5] == ["python3", "-m", "npu_rl.trainer.main_ppo", "--config-name", "ppo_trainer"]
    assert f"critic.model.path={tiny_model_dir}" in words and "trainer.total_epochs=15" in words
    assert train_main([*words[3:5], "--cfg", "job", *words[5:]]) == 0, capsys.readouterr().err


def printed_command(out: str) -> list[str]:
    command = out.split("# the equivalent npu-rl command:\n", 1)[1]
    return shlex.split("\n".join(line for line in command.splitlines() if not line.startswith("#")).replace(
        "\\\n", " "))


def test_migrate_cli_refusal_exit_code_and_overrides_file(capsys, tmp_path):
    listing = tmp_path / "overrides.txt"
    listing.write_text("# a comment\ncritic.fsdp.param_offload=True\nactor_rollout_ref.actor.use_prefix_grouper=True\n")
    assert main(["--overrides-file", str(listing), "--skip-paths"]) == 1
    out = capsys.readouterr().out
    assert "mapped     critic.fsdp.param_offload=True" in out and "-> critic.model.fsdp_config.param_offload" in out
    assert "#   actor_rollout_ref.actor.use_prefix_grouper=True    # refused" in out
    assert main(["--overrides", "data.video_key=videos", "--skip-paths"]) == 0
    assert "no effect  data.video_key=videos" in capsys.readouterr().out
    assert main(["--overrides", "data.image_key=images", "--skip-paths"]) == 0  # read now (docs/vl.md)
    assert "supported  data.image_key=images" in capsys.readouterr().out
    assert main([]) == 2


def test_dapo_entry_point_brings_its_defaults(capsys, tmp_path):
    script = tmp_path / "run_dapo.sh"
    script.write_text("python3 -m recipe.dapo.main_dapo \\\n    trainer.project_name=mine \\\n"
                      "    reward_model.overlong_buffer.enable=False\n")
    assert main([str(script), "--skip-paths"]) == 0
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



# ---------------------------------------------------------------------------------- migrate tells the truth
@pytest.mark.parametrize("override, named", [
    ("actor_rollout_ref.rollout.name=sglang", "the sglang rollout engine is not supported"),
    ("actor_rollout_ref.actor.strategy=megatron", "the megatron engine is not supported"),
    ("actor_rollout_ref.actor.strategy=fsdp_turbo", "'turbo' FSDP engine is not supported"),
    ("algorithm.adv_estimator=foo", "algorithm.adv_estimator"),
])
def test_migrate_refuses_a_value_the_loader_refuses(override, named, capsys):
    assert main(["--overrides", override, "--skip-paths"]) == 1
    out = capsys.readouterr().out
    assert named in out and override.split("=")[1] in out, out


def test_migrate_checks_paths_unless_told_not_to(capsys, tmp_path):
    missing = f"data.train_files={tmp_path}/nothing.parquet"
    assert main(["--overrides", missing]) == 1
    assert "nothing.parquet' does not exist" in capsys.readouterr().out
    assert main(["--overrides", missing, "--skip-paths"]) == 0


def test_migrate_reads_hydras_own_flags(capsys, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo --config-name=ppo_trainer.yaml -cp " f"{tmp_path} "
                      "trainer.total_epochs=2\n")
    main([str(script), "--skip-paths"])
    out = capsys.readouterr().out
    assert "unknown" not in out and "flag       --config-name=ppo_trainer.yaml" in out, out
    assert f"--config-name ppo_trainer --config-path {tmp_path}" in out


def test_migrate_command_passes_cfg_job_on_verl_example_scripts(capsys, tmp_path, tiny_model_dir):
    """A verl example script (its overrides as the script passes them) whose paths exist: the printed command loads."""
    listing = tmp_path / "overrides.txt"
    paths = {"data.train_files": tmp_path / "train.parquet", "data.val_files": tmp_path / "test.parquet"}
    for path in paths.values():
        write_verl_parquet(path)
    lines = []
    for line in read_overrides("grpo_trainer_run_qwen3_8b_fsdp"):
        key = line.split("=", 1)[0]
        lines.append(f"{key}={paths[key]}" if key in paths else
                     f"{key}={tiny_model_dir}" if key == "actor_rollout_ref.model.path" else line)
    listing.write_text("\n".join(lines) + "\n")
    assert main(["--overrides-file", str(listing)]) == 0, capsys.readouterr().out
    words = printed_command(capsys.readouterr().out)
    assert train_main([*words[3:5], "--cfg", "job", *words[5:]]) == 0, capsys.readouterr().err


# ---------------------------------------------------------------------- hostile or odd scripts (issue 29)
@pytest.fixture
def short_limits(monkeypatch):
    """Limits the bombs meet sooner than the reader's own (5 s, 512 MiB): what is tested is that one of them stops
    the script, and each second of the time limit is a second an endless loop holds the lane."""
    monkeypatch.setattr(script_module, "TIME_LIMIT_S", 1.0)
    monkeypatch.setattr(script_module, "MEMORY_LIMIT", 256 << 20)


@pytest.mark.parametrize("body", [
    'x=$((9**9**9)); python3 -m verl.trainer.main_ppo trainer.total_epochs=$x',  # bash's 64-bit arithmetic
])
def test_arithmetic_bombs_finish(body):
    reading = read_script(body)
    assert reading.overrides[0].startswith("trainer.total_epochs=")


@pytest.mark.parametrize("body", [
    "a=x; while :; do a=$a$a; done",  # string doubling
    'a=(x); while :; do a=("${a[@]}" "${a[@]}"); done',  # array doubling
    "while :; do :; done",
])
def test_bombs_and_endless_loops_are_stopped(body, short_limits):
    import time

    start = time.monotonic()
    with pytest.raises(ScriptError, match="did not finish within|of memory|processor time"):
        read_script(body)
    assert time.monotonic() - start < 10


def _live_processes_under(folder) -> int:
    """Live processes whose command line names ``folder`` (the reader's bash and every fork of it do)."""
    count = 0
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except (OSError, ValueError):
            continue
        count += str(folder).encode() in cmdline and stat[stat.rindex(b")") + 2:][:1] != b"Z"
    return count


def _none_left_under(folder, within_s: float = 3.0) -> bool:
    import time

    end = time.monotonic() + within_s  # a process killed on a loaded machine takes a moment to go
    while _live_processes_under(folder):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


LIMIT = f"the script started more than {script_module.MAX_PROCESSES} processes at once"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="counts processes through /proc")
@pytest.mark.parametrize("body, said", [
    (":(){ :|:& };:\nwhile :; do :; done", LIMIT),  # the classic fork bomb, the script still running
    # a loop of '( ... ) &' that wait (longer than the time limit: however slowly a loaded machine forks, the
    # processes only add up until the limit stops them)
    ("while :; do ( coproc { read -t 10 x; }; wait ) & done", LIMIT),
    ("set -m; while :; do ( coproc { read -t 10 x; }; wait ) & done", LIMIT),  # job control: dropped
    # job control on all the same: each job in a group of its own, all in bash's session (a loop, not a bomb:
    # this machine is shared, and the exponential form under job control is not run here)
    ("builtin set -m; while :; do ( coproc { read x; }; wait ) & done", LIMIT),
    ("f() { x=$(f); }; f", LIMIT),  # command substitutions nested without end (each waits for the next)
    # subshells that spin: on a loaded machine the loop may reach the time limit before the process limit
    ("while :; do ( while :; do :; done ) & done", f"{LIMIT}|did not finish within"),
])
def test_fork_bombs_are_stopped_at_the_process_limit_and_leave_nothing_behind(body, said, tmp_path, monkeypatch):
    import tempfile
    import time

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the reader's folder, so its processes can be found
    start = time.monotonic()
    with pytest.raises(ScriptError, match=said):
        read_script(body)
    assert time.monotonic() - start < script_module.TIME_LIMIT_S + 3  # the limits hold (a kill takes a moment)
    assert _none_left_under(tmp_path)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="counts processes through /proc")
def test_the_limit_holds_while_other_programs_threads_end_as_fast_as_the_script_forks(tmp_path, monkeypatch):
    """The machine's thread total only says when to count early: here it never grows, as when other programs'
    threads end while the script forks (a loaded machine), and the session is counted all the same."""
    import tempfile
    import time

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(script_module, "_threads_total", lambda: 1000)
    start = time.monotonic()
    with pytest.raises(ScriptError, match=LIMIT):
        read_script("builtin set -m; while :; do ( coproc { read x; }; wait ) & done")
    assert time.monotonic() - start < script_module.TIME_LIMIT_S  # stopped by the process limit, not the time limit
    assert _none_left_under(tmp_path)


def test_jobs_the_script_leaves_behind_in_groups_of_their_own_are_killed(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    reading = read_script("builtin set -m; ( coproc { read x; }; wait ) & ( coproc { read x; }; wait ) &\n"
                          "python3 -m verl.trainer.main_ppo trainer.total_epochs=1")  # each job would wait forever
    assert reading.overrides == ["trainer.total_epochs=1"]
    assert _none_left_under(tmp_path)


def test_kill_cannot_be_switched_back_on():
    reading = read_script("enable kill; kill -0 1 && python3 -m verl.trainer.main_ppo a=killed\n"
                          "python3 -m verl.trainer.main_ppo trainer.total_epochs=1")
    assert reading.overrides == ["trainer.total_epochs=1"]
    assert "enable (line 1), kill (line 1)" in " ".join(reading.warnings)


def test_a_bomb_the_script_leaves_behind_is_killed_with_it(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        read_script(":(){ :|:& };:")  # bash ends at once; what it started is killed with its group
    except ScriptError as exc:  # or it grew past the limit first
        assert "processes at once" in str(exc)
    assert _none_left_under(tmp_path)


def test_non_text_input_is_refused(tmp_path, capsys):
    (tmp_path / "nul.sh").write_bytes(b"a=1\nb=\0x\n")
    (tmp_path / "bin.sh").write_bytes(b"a=1\n\xff\xfe\x00\x01")
    (tmp_path / "latin.sh").write_bytes(b"echo caf\xe9\n")
    for name, said in (("nul.sh", "line 2: a NUL byte"), ("bin.sh", "line 2: a NUL byte"),
                       ("latin.sh", "line 1: not UTF-8")):
        assert main([str(tmp_path / name)]) == 2
        assert said in capsys.readouterr().err
    assert main(["/dev/zero"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_invalid_script_is_refused_with_its_line(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text("a=1\necho 'unterminated\npython3 -m verl.trainer.main_ppo a=1\n")
    assert main([str(script)]) == 2
    err = capsys.readouterr().err
    assert "not a valid bash script: line 2: unexpected EOF while looking for matching" in err, err  # the quote


def test_script_without_trainer_call_is_a_usage_error(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text("echo hello\n")
    assert main([str(script)]) == 2
    assert "no trainer call found" in capsys.readouterr().err


def test_export_backticks_and_redirections(tmp_path):
    reading = read_script("export FOO=bar\nB=`date`\npython3 -m verl.trainer.main_ppo a=$FOO b=$B > log.txt 2>&1\n")
    assert reading.overrides == ["a=bar", "b="]
    assert "date (line 2)" in reading.warnings[0]  # named: not run, empty
    assert not (tmp_path / "log.txt").exists()


def test_the_script_runs_nothing_and_writes_nothing(tmp_path):
    marker = tmp_path / "marker"
    reading = read_script(f"/bin/touch {marker}\necho x > {marker}\nkill -0 $$ && echo y\n"
                          "python3 -m verl.trainer.main_ppo a=1\n")
    assert not marker.exists() and reading.overrides == ["a=1"]


def test_secrets_are_never_expanded_from_the_environment(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-planted-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_planted_secret")
    script = tmp_path / "run.sh"
    script.write_text('python3 -m verl.trainer.main_ppo trainer.project_name="${HF_TOKEN}" '
                      '+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY=$WANDB_API_KEY\n')
    main([str(script), "--skip-paths"])
    out = capsys.readouterr().out
    assert "planted" not in out
    assert '"ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY=$WANDB_API_KEY"' in out  # expanded at run time
    assert '"trainer.project_name=$HF_TOKEN"' in out


def test_no_file_read_by_redirection_and_no_unnamed_variable_reaches_the_output(capsys, tmp_path, monkeypatch):
    """issue 39: ``$(< ~/.token)`` printed the token, and ``declare -p`` / ``/proc/self/environ`` the whole
    environment of the process; a variable the script names is still read."""
    monkeypatch.setenv("PLANTED_PLAIN", "env-planted-value")
    monkeypatch.setenv("MODEL_DIR", "/models")
    token = tmp_path / "token"
    token.write_text("tok-planted-file\n")
    script = tmp_path / "run.sh"
    script.write_text(f"X=`< {token}`\nread -r Y < {token}\nmapfile -t Z < \"{token}\"\nE=$(declare -p)\n"
                      "python3 -m verl.trainer.main_ppo "
                      f'trainer.experiment_name="$(< {token})" trainer.project_name="$X$Y${{Z[*]}}" '
                      f'data.train_files=$(<{token}) "data.val_files=$(< /proc/self/environ)" '
                      'actor_rollout_ref.model.path="$MODEL_DIR/q" "+custom_reward_function.reward_kwargs.e=$E" '
                      "> log 2>&1\n")
    main([str(script), "--skip-paths"])
    out = capsys.readouterr().out
    assert "planted" not in out, out
    assert "actor_rollout_ref.model.path=/models/q" in out


def test_unset_variables_are_named_and_read_as_bash_reads_them():
    reading = read_script('NAME=run_${ENGINE}\nENGINE=${ENGINE:-vllm}\npython3 -m verl.trainer.main_ppo '
                          'actor_rollout_ref.model.path="$MODEL_PATH/x" a=${B:-two} e=$ENGINE n=$NAME "${EXTRA[@]}"\n')
    assert reading.overrides == ["actor_rollout_ref.model.path=/x", "a=two", "e=vllm", "n=run_"]
    assert any("line 3: $MODEL_PATH is not set" in w for w in reading.warnings), reading.warnings
    assert any("line 1: $ENGINE is not set" in w for w in reading.warnings)


def test_a_secret_written_in_the_script_is_masked(capsys, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo "
                      "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY=wandb-planted-literal\n")
    main([str(script), "--skip-paths"])
    out = capsys.readouterr().out
    assert "planted" not in out and "WANDB_API_KEY=<redacted>" in out


def test_prime_script_migrates_to_main_prime(tmp_path, capsys):
    """verl-recipe's PRIME launch becomes npu_rl.trainer.main_prime with its config, and its overrides pass."""
    script = tmp_path / "run_prime.sh"
    script.write_text("python3 -m recipe.prime.main_prime data.train_batch_size=8 data.filter_accuracy=True "
                      "data.accuracy_lower_bound=0.2 data.oversample_factor=4 algorithm.adv_estimator=rloo "
                      "reward_model.model.update=before reward_model.model.beta_train=0.05 "
                      "reward_model.mini_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8\n")
    assert main([str(script), "--skip-paths"]) == 0
    out = capsys.readouterr().out
    assert "python3 -m npu_rl.trainer.main_prime --config-name prime_trainer" in out
    assert "the kept overrides load and pass the checks" in out
