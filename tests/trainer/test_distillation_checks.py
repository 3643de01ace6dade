"""distillation.*: what the plan carries, and what validation refuses (npu_rl/trainer/checks/distillation.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from npu_rl.config.errors import ConfigError
from npu_rl.core.distillation import DistillationSpec
from npu_rl.trainer.preflight import load_checked, run_settings_for
from tests.trainer.conftest import base_overrides


def _config(model_dir, tmp_path, *extra):
    return load_checked(base_overrides(model_dir, str(tmp_path / "run")) + ["algorithm.adv_estimator=grpo"] + list(extra),
                        "ppo_trainer")


def _distil(teacher, *extra):
    return ["distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={teacher}", *extra]


def test_off_by_default_and_no_teacher_role(tiny_model_dir, tmp_path):
    from npu_rl.workers.roles import worker_specs

    config = _config(tiny_model_dir, tmp_path)
    settings = run_settings_for(config)
    assert settings.distillation is None and "teacher" not in worker_specs(config, settings)


def test_the_plan_carries_verls_settings(tiny_model_dir, tmp_path):
    from npu_rl.workers.roles import worker_specs

    config = _config(tiny_model_dir, tmp_path, *_distil(
        tiny_model_dir, "distillation.distillation_loss.loss_mode=k1",
        "distillation.distillation_loss.use_policy_gradient=True", "distillation.distillation_loss.clip_ratio_high=null",
        "distillation.distillation_loss.clip_ratio=0.3", "distillation.distillation_loss.loss_max_clamp=10.0",
        "distillation.teacher_models.teacher_model.inference.dtype=bfloat16", "distillation.nnodes=1"))
    settings = run_settings_for(config)
    assert settings.distillation == DistillationSpec(
        loss_mode="k1", use_task_rewards=True, distillation_loss_coef=1.0, loss_max_clamp=10.0,
        use_policy_gradient=True, clip_ratio_low=0.2, clip_ratio_high=0.3)
    assert config.distillation.teacher_models["teacher_model"].fsdp_config.model_dtype == "bfloat16"  # verl's alias
    spec = worker_specs(config, settings)["teacher"]
    model_cfg, ref_cfg = spec.args[0], spec.args[1]
    assert model_cfg.path == tiny_model_dir and model_cfg.lora_rank == 0
    assert ref_cfg.fsdp_config.model_dtype == "bfloat16"


@pytest.mark.parametrize("extra,match", [
    ([], None),
    (["distillation.distillation_loss.loss_mode=k1"], r"loss_mode=k1 with use_policy_gradient=False"),
    (["distillation.distillation_loss.loss_mode=forward_kl_topk"], None),
    (["distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=0"],
     r"distillation.distillation_loss.topk=0"),
    (["distillation.distillation_loss.loss_mode=forward_kl_topk", "actor_rollout_ref.model.use_fused_kernels=True"],
     r"forward_kl_topk with actor_rollout_ref.model.use_fused_kernels=True"),
    (["distillation.distillation_loss.loss_mode=k5"], r"'k5' is not a distillation loss"),
    (["distillation.distillation_loss.loss_max_clamp=-1"], r"loss_max_clamp=-1.0 must be > 0"),
    (["distillation.distillation_loss.use_policy_gradient=True",
      "distillation.distillation_loss.policy_loss_mode=gspo"], r"only 'vanilla'"),
])
def test_loss_settings_are_checked(tiny_model_dir, tmp_path, extra, match):
    if match is None:
        _config(tiny_model_dir, tmp_path, *_distil(tiny_model_dir, *extra))
        return
    with pytest.raises(ConfigError, match=match):
        _config(tiny_model_dir, tmp_path, *_distil(tiny_model_dir, *extra))


def test_a_teacher_is_needed(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"distillation.enabled=True needs distillation.teacher_models.teacher_model"
                                          r".model_path"):
        _config(tiny_model_dir, tmp_path, "distillation.enabled=True")


def test_a_missing_teacher_folder_is_named(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"distillation.teacher_models.teacher_model.model_path: .*nowhere"):
        _config(tiny_model_dir, tmp_path, *_distil(str(tmp_path / "nowhere")))


def _mopd(model_dir, *extra):
    """verl's examples/on_policy_distillation_trainer/run_qwen3_8b_mopd_fsdp.sh, on the tiny model."""
    return ["distillation.enabled=True", "distillation.teacher_key=data_source",
            "+distillation.teacher_models.gsm8k.key=openai/gsm8k", f"+distillation.teacher_models.gsm8k.model_path={model_dir}",
            "+distillation.teacher_models.gsm8k.num_replicas=1", "+distillation.teacher_models.gsm8k.inference.name=vllm",
            "+distillation.teacher_models.gsm8k.inference.tensor_model_parallel_size=2",
            "+distillation.teacher_models.geo3k.key=hiyouga/geometry3k",
            f"+distillation.teacher_models.geo3k.model_path={model_dir}",
            "+distillation.teacher_models.geo3k.inference.dtype=float32", *extra]


def test_several_teachers_as_verl_writes_them(tiny_model_dir, tmp_path):
    from npu_rl.workers.roles import own_pools, teacher_roles, worker_specs

    config = _config(tiny_model_dir, tmp_path, *_mopd(tiny_model_dir))
    d = config.distillation
    assert sorted(d.teacher_models) == ["geo3k", "gsm8k", "teacher_model"]  # the default entry stays, unused
    assert sorted(d.teachers()) == ["hiyouga/geometry3k", "openai/gsm8k"]
    assert d.teachers()["hiyouga/geometry3k"].fsdp_config.model_dtype == "float32"  # verl's inference.dtype
    roles = teacher_roles(config)
    assert roles == {"teacher[openai/gsm8k]": "openai/gsm8k", "teacher[hiyouga/geometry3k]": "hiyouga/geometry3k"}
    specs = worker_specs(config, run_settings_for(config))
    assert all(role in specs for role in roles) and "teacher" not in specs
    assert own_pools(config) == {}  # distillation.nnodes=0: beside the actor
    pooled = _config(tiny_model_dir, tmp_path, *_mopd(tiny_model_dir, "distillation.nnodes=1",
                                                      "distillation.n_gpus_per_node=2"))
    pools = own_pools(pooled)
    assert set(pools) == set(roles) and len(set(pools.values())) == 1  # one teacher pool, both teachers on it
    one = _config(tiny_model_dir, tmp_path, *_distil(tiny_model_dir))
    assert teacher_roles(one) == {"teacher": "default"}


def test_what_several_teachers_refuse(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"distillation.teacher_models.teacher_model.model_path is set beside other "
                                          r"teachers \(gsm8k, geo3k\)"):
        _config(tiny_model_dir, tmp_path, *_mopd(tiny_model_dir,
                f"distillation.teacher_models.teacher_model.model_path={tiny_model_dir}"))
    with pytest.raises(ConfigError, match=r"distillation.teacher_models.extra.key is missing"):
        _config(tiny_model_dir, tmp_path, *_mopd(tiny_model_dir,
                f"+distillation.teacher_models.extra.model_path={tiny_model_dir}"))
    with pytest.raises(ConfigError, match=r"two teachers share a key"):
        _config(tiny_model_dir, tmp_path, *_mopd(tiny_model_dir, "+distillation.teacher_models.extra.key=openai/gsm8k",
                f"+distillation.teacher_models.extra.model_path={tiny_model_dir}"))
    with pytest.raises(ConfigError, match=r"distillation.teacher_models.geo3k.model_path: .*nowhere"):
        _config(tiny_model_dir, tmp_path, *_mopd(tiny_model_dir,
                f"+distillation.teacher_models.geo3k.model_path={tmp_path / 'nowhere'}"))
    with pytest.raises(ConfigError, match=r"'inferense' is not a key of|inferense"):
        _config(tiny_model_dir, tmp_path, *_mopd(tiny_model_dir, "+distillation.teacher_models.geo3k.inferense.x=1"))


def _edit(folder, name, **changes):
    path = folder / name
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_a_teacher_with_another_vocabulary_is_refused(tiny_model_dir, tmp_path):
    small = shutil.copytree(tiny_model_dir, tmp_path / "small")
    _edit(small, "config.json", vocab_size=64)
    with pytest.raises(ConfigError, match=r"teacher's vocabulary \(64 ids.*smaller than the student's \(128"):
        _config(tiny_model_dir, tmp_path, *_distil(str(small)))
    other = shutil.copytree(tiny_model_dir, tmp_path / "other")
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two tokens swap ids
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError, match=r"maps tokens to other ids than the student's"):
        _config(tiny_model_dir, tmp_path, *_distil(str(other)))


def test_a_vision_language_teacher_is_refused(tiny_model_dir, tmp_path):
    vlm = shutil.copytree(tiny_model_dir, tmp_path / "vlm")
    _edit(vlm, "config.json", architectures=["Qwen2_5_VLForConditionalGeneration"], vision_config={"depth": 2})
    with pytest.raises(ConfigError, match=r"teacher_model.model_path: .*vision-language model .*distils text-only"):
        _config(tiny_model_dir, tmp_path, *_distil(str(vlm)))


def test_asynchronous_modes_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"distillation.enabled=True with async_training.mode=one_step_off"):
        _config(tiny_model_dir, tmp_path, *_distil(tiny_model_dir), "async_training.mode=one_step_off")
