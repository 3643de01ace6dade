"""Config composition and validation: verl's keys, presets, and errors that say what to change."""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from npu_rl.config.loader import ConfigError, all_keys, compose, load_config, to_dataclass
from npu_rl.config.schema import PPOConfig
from npu_rl.trainer.preflight import check as validate, load_checked
from tests.conftest import REPO_ROOT
from tests.helpers import write_verl_parquet

PRESETS = ("ppo", "grpo", "dapo", "gspo", "rloo", "reinforce_plus_plus", "remax")


def cfg(*overrides, name="ppo_trainer") -> PPOConfig:
    return to_dataclass(compose(list(overrides), name))


def problems_of(config: PPOConfig, **kwargs) -> list[str]:
    try:
        validate(config, **kwargs)
    except ConfigError as exc:
        return exc.problems
    return []


# ------------------------------------------------------------------------------------------------- defaults
def test_verl_defaults_and_interpolations():
    c = cfg()
    assert c.actor_rollout_ref.actor.optim.lr == 1e-6
    assert c.actor_rollout_ref.actor.clip_ratio_c == 3.0
    assert c.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert c.critic.optim.lr == 1e-5
    assert c.algorithm.adv_estimator == "gae"
    # interpolations follow the key they point at
    c = cfg("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096", "data.max_response_length=99",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32")
    assert c.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 4096
    assert c.actor_rollout_ref.rollout.response_length == 99
    assert c.critic.ppo_mini_batch_size == 32


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_compose_and_pass_schema_checks(preset, tmp_path):
    c = cfg(f"preset={preset}", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    assert problems_of(c, check_paths=False, check_device=False) == []


def test_preset_values():
    dapo = cfg("preset=dapo")
    assert (dapo.actor_rollout_ref.actor.clip_ratio_low, dapo.actor_rollout_ref.actor.clip_ratio_high) == (0.2, 0.28)
    assert dapo.algorithm.filter_groups.enable and dapo.reward_model.reward_manager == "dapo"
    assert cfg("preset=gspo").actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
    # a key given on the command line wins over the preset
    assert cfg("preset=dapo", "actor_rollout_ref.actor.clip_ratio_high=0.3").actor_rollout_ref.actor.clip_ratio_high \
        == 0.3


# ------------------------------------------------------------------------------------------------- bad keys
@pytest.mark.parametrize("override, suggestion", [
    ("actor_rollout_ref.actor.optim.lrr=1e-6", "actor_rollout_ref.actor.optim.lr"),
    ("actor_rollout_ref.actor.lr=1e-6", "actor_rollout_ref.actor.optim.lr"),
    ("+actor_rollout_ref.actor.clip_ration_high=0.3", "actor_rollout_ref.actor.clip_ratio_high"),
    ("trainer.total_epoch=2", "trainer.total_epochs"),
    ("actor_rollout_ref.rollout.val_kwargs.temp=0", "actor_rollout_ref.rollout.val_kwargs.temperature"),
])
def test_misspelt_key_suggests_the_closest(override, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean '{suggestion}'"):
        compose([override])


def test_unknown_key_without_a_near_one():
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.zzz' \('zzz' is not a key of trainer\)$"):
        compose(["+trainer.zzz=1"])


def test_free_form_dicts_accept_new_keys_and_plus_on_known_keys_is_fine():
    c = cfg("+actor_rollout_ref.model.override_config.attention_dropout=0.", "+trainer.val_before_train=False",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4")
    assert c.actor_rollout_ref.model.override_config == {"attention_dropout": 0.0}
    assert c.trainer.val_before_train is False
    assert c.actor_rollout_ref.rollout.engine_kwargs.vllm == {"swap_space": 4}


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.optim.lr=abc", "actor_rollout_ref.actor.optim.lr: Value 'abc'"),
    ("data.train_batch_size=1.5", "data.train_batch_size: Value '1.5'"),
    ("trainer.val_before_train=maybe", "trainer.val_before_train"),
    ("preset=grpx", "preset='grpx' does not exist; available: dapo, grpo"),
])
def test_wrong_types_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        compose([override])


def test_unparsable_override_is_named_with_a_quoting_hint():
    # (a data path's `?split=...` query is quoted for the user: npu_rl.config.loader.quote_query_value)
    with pytest.raises(ConfigError, match=r"cannot parse the override 'data.train_files=builtin://arith/train=a'.*"
                                          r"quote a value"):
        compose(["trainer.total_epochs=2", "data.train_files=builtin://arith/train=a"])


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        compose(["actor_rollout_ref.actor.optim.lrr=1", "trainer.total_epoch=2"])
    assert len(info.value.problems) == 2


# ------------------------------------------------------------------------------------------------- semantics
def small(*overrides) -> PPOConfig:
    return cfg("data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
               "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
               "algorithm.adv_estimator=grpo", *overrides)


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.actor.clip_ratio_c=1.0", "clip_ratio_c=1.0 must be > 1"),
    ("algorithm.adv_estimator=grpoo", "unknown advantage estimator 'grpoo'"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=vanila", "unknown policy loss 'vanilla'"[:20]),
    ("actor_rollout_ref.actor.loss_agg_mode=token-max", "loss_agg_mode='token-max' is not one of"),
    ("reward_model.reward_manager=naiv", "naiv"),
    ("data.truncation=center", "data.truncation='center' is not one of error, left, right, middle"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=3", "must be a multiple of actor_rollout_ref.actor.ppo_mini_batch"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0", "ppo_micro_batch_size_per_gpu=0 must be > 0"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "tensor_model_parallel_size=2 must divide the 1"),
    ("algorithm.filter_groups.enable=True", "filter_groups.metric"),
    ("actor_rollout_ref.model.lora_adapter_path=/nowhere", "lora_adapter_path='/nowhere' is set but"),
    ("actor_rollout_ref.model.lora_rank=-1", "lora_rank=-1 must be >= 0"),
    ("trainer.resume_mode=resume_path", "trainer.resume_from_path"),
])
def test_semantic_errors_say_what_to_change(override, message):
    problems = problems_of(small(override), check_paths=False, check_device=False)
    assert any(message in p for p in problems), problems


def test_critic_loss_agg_mode_is_checked_at_validation_when_a_critic_runs():
    """Not at the first critic update, minutes into the run (the interpolated default follows the actor's)."""
    bad = "critic.loss_agg_mode=seq-mean"
    problems = problems_of(small("algorithm.adv_estimator=gae", bad), check_paths=False, check_device=False)
    assert any("critic.loss_agg_mode='seq-mean' is not one of" in p for p in problems), problems
    assert not problems_of(small(bad), check_paths=False, check_device=False)  # grpo: no critic, nothing to check


def test_lora_keys_checked():
    assert problems_of(small("actor_rollout_ref.model.lora_rank=8"), check_paths=False, check_device=False) == []
    problems = problems_of(small("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=0",
                                 "actor_rollout_ref.model.target_modules=[]",
                                 "actor_rollout_ref.model.lora_adapter_path=/nowhere"),
                           check_paths=False, check_device=False)
    for message in ("lora_alpha=0 must be a finite number > 0", "target_modules=[]",
                    "lora_adapter_path='/nowhere' is not a folder"):
        assert any(message in p for p in problems), problems
    problems = problems_of(small("algorithm.adv_estimator=gae", "critic.model.lora_rank=8"), check_paths=False,
                           check_device=False)
    assert any("LoRA on the critic is not supported" in p for p in problems), problems


def test_lora_targets_and_adapter_checked_against_the_model(tiny_model_dir, tmp_path):
    """At validation, on a meta-device skeleton: targets that match nothing, an adapter for another model."""
    from npu_rl.models.lora import LoraSpec, apply_lora, save_adapter
    from npu_rl.models.synthetic import random_causal_lm

    model = f"actor_rollout_ref.model.path={tiny_model_dir}"
    problems = problems_of(small(model, "actor_rollout_ref.model.lora_rank=4",
                                 "actor_rollout_ref.model.target_modules=[qkv]"), check_device=False)
    assert any("target_modules=['qkv']" in p and "matches no linear layer" in p for p in problems), problems
    wide = random_causal_lm("tiny", hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    save_adapter(apply_lora(wide, LoraSpec(rank=4)), str(tmp_path / "adapter"))
    problems = problems_of(small(model, "actor_rollout_ref.model.lora_rank=4",
                                 f"actor_rollout_ref.model.lora_adapter_path={tmp_path}/adapter"), check_device=False)
    assert any("different base model" in p for p in problems), problems


def test_kl_type_checked_only_when_used():
    assert problems_of(small("actor_rollout_ref.actor.kl_loss_type=k9"), check_paths=False, check_device=False) == []
    problems = problems_of(small("actor_rollout_ref.actor.kl_loss_type=k9", "actor_rollout_ref.actor.use_kl_loss=True"),
                           check_paths=False, check_device=False)
    assert any("k9" in p for p in problems), problems


def test_missing_files_fail_naming_the_key(tmp_path):
    problems = problems_of(small(f"data.train_files={tmp_path}/nope.parquet",
                                 f"actor_rollout_ref.model.path={tmp_path}/no_model"), check_device=False)
    assert any("data.train_files: data file" in p and "nope.parquet" in p for p in problems), problems
    assert any(p.startswith("actor_rollout_ref.model.path:") and "does not exist" in p for p in problems), problems


def test_device_npu_here_fails_clearly(monkeypatch):
    monkeypatch.delenv("DEVICE", raising=False)
    problems = problems_of(small("trainer.device=npu"), check_paths=False)
    assert any(p.startswith("trainer.device: DEVICE=npu was requested") and "torch-npu" in p for p in problems)


def test_schema_has_every_key_the_reference_lists():
    keys = set(all_keys())
    for key in ("data.gen_batch_size", "actor_rollout_ref.actor.fsdp_config.forward_prefetch",
                "actor_rollout_ref.rollout.val_kwargs.do_sample", "actor_rollout_ref.ref.fsdp_config.param_offload",
                "algorithm.filter_groups.max_num_gen_batches", "reward_model.overlong_buffer.penalty_factor",
                "trainer.critic_warmup", "trainer.balance_batch", "critic.model.fsdp_config.param_offload",
                "actor_rollout_ref.model.fused_kernel_options.impl_backend", "algorithm.kl_ctrl.target_kl"):
        assert key in keys, key


# ------------------------------------------------------------------------------------------------- seed scripts
def _script_overrides(script: str, tmp_path, env: dict[str, str]) -> list[str]:
    """Run a run-script with stand-ins for python3 / ray / npu-rl on PATH and collect main_ppo's arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    capture = tmp_path / "args.txt"
    stub = textwrap.dedent(f"""\
        #!/usr/bin/env python3
        import sys
        args = sys.argv[1:]
        if "npu_rl.trainer.main_ppo" in args:
            with open({str(capture)!r}, "w") as f:
                f.write("\\n".join(args[args.index("npu_rl.trainer.main_ppo") + 1:]))
        """)
    for name in ("python3", "ray", "npu-rl"):
        (bin_dir / name).write_text(stub.replace("#!/usr/bin/env python3", f"#!{os.sys.executable}"))
        (bin_dir / name).chmod(0o755)
    run_env = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", os.path.join(REPO_ROOT, "scripts", script)], check=True, cwd=tmp_path, env=run_env,
                   capture_output=True)
    return capture.read_text().split("\n")


def test_seed_ppo_script_resolves_and_validates(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.parquet", "test.parquet"):
        write_verl_parquet(data / name)
    overrides = _script_overrides("run_ppo_gsm8k_single_card.sh", tmp_path,
                                  {"MODEL_PATH": tiny_model_dir, "DATA_DIR": str(data)})
    assert "critic.ppo_micro_batch_size_per_gpu=4" in overrides and len(overrides) == 24
    config = load_checked(overrides, "ppo_trainer")  # validates paths and the device too
    assert config.critic.model.path == tiny_model_dir and config.trainer.total_epochs == 15


def test_seed_dapo_npu_script_fails_only_on_missing_files_and_device(tmp_path, monkeypatch):
    monkeypatch.delenv("DEVICE", raising=False)
    overrides = _script_overrides("run_dapo_qwen2.5_32b_npu.sh", tmp_path, {"DATA_HOME": str(tmp_path / "none")})
    assert "+actor_rollout_ref.rollout.enable_expert_parallel=False" in overrides
    config = load_config(overrides, "ppo_trainer")
    assert config.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 8
    assert config.reward_model.overlong_buffer.len == 4096
    problems = problems_of(config)
    assert problems, "the DAPO script points at files and NPUs this machine lacks"
    for p in problems:
        assert p.startswith(("data.train_files: data file", "data.val_files: data file", "actor_rollout_ref.model.path:",
                             "trainer.device: DEVICE=npu was requested")), p


def test_keys_without_effect_get_a_note_only_when_set():
    from npu_rl.config.key_docs import ignored_settings

    assert ignored_settings(cfg()) == []
    notes = ignored_settings(cfg("actor_rollout_ref.actor.entropy_checkpointing=True", "trainer.default_hdfs_dir=/x"))
    assert len(notes) == 2 and "entropy_checkpointing=True has no effect in npu-rl" in notes[0]
    # use_torch_compile has an effect now (compiled blocks where the device layer allows them): no note
    assert ignored_settings(cfg("actor_rollout_ref.actor.use_torch_compile=False")) == []


@pytest.fixture
def emulated_bf16(monkeypatch):
    from npu_rl.device.backend import Backend

    monkeypatch.setattr(Backend, "computes_bf16_natively", lambda self: False)


def _dtypes(config):
    a = config.actor_rollout_ref
    return (a.actor.fsdp_config.mixed_precision.param_dtype, a.ref.fsdp_config.mixed_precision.param_dtype,
            a.rollout.dtype)


def test_embedded_default_computes_in_fp32_where_bf16_is_emulated(emulated_bf16):
    from npu_rl.trainer.preflight import load_checked

    notes: list[str] = []
    assert _dtypes(load_checked([], "quickstart", notes=notes, check_paths=False)) == ("fp32", "fp32", "float32")
    assert any("computes in fp32" in n and "AVX512-BF16" in n for n in notes), notes
    # what the user sets wins, key by key
    config = load_checked(["actor_rollout_ref.rollout.dtype=bfloat16"], "quickstart", check_paths=False)
    assert _dtypes(config) == ("fp32", "fp32", "bfloat16")
    # verl's defaults and a config of the user's own are never changed
    assert _dtypes(load_checked([], "ppo_trainer", check_paths=False)) == ("bf16", "bf16", "bfloat16")


def test_embedded_default_keeps_bf16_where_it_is_native(monkeypatch):
    from npu_rl.device.backend import Backend
    from npu_rl.trainer.preflight import load_checked

    monkeypatch.setattr(Backend, "computes_bf16_natively", lambda self: True)
    notes: list[str] = []
    assert _dtypes(load_checked([], "quickstart", notes=notes, check_paths=False)) == ("bf16", "bf16", "bfloat16")
    assert not any("computes in fp32" in n for n in notes)
