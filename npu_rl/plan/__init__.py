"""Will a job fit? The per-device memory of each phase of one RL step, from the config and the model's config.json
(no weights needed), for a named device. :mod:`npu_rl.plan.memory` is the arithmetic, :mod:`npu_rl.plan.job` reads
a config into it; ``npu-rl plan`` (npu_rl/commands/plan.py), ``--cfg job`` and the doctor print it."""
