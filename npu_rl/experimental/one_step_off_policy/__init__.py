"""``python -m npu_rl.experimental.one_step_off_policy.main_ppo``: verl's one-step off-policy trainer (docs/async.md)."""
