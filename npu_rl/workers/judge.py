"""The generative reward model's server inside the job: a causal LM (``reward_model.model.path``) on our rollout
engine (``reward_model.rollout.name``: hf, or vllm in one-device runs), frozen (no weight sync), asleep (offloaded,
sleep level 1) between steps.

Rank 0 holds and runs the judge (no collectives; every request of a step goes through it in one batched
``generate_token_lists`` call); the other ranks hold nothing. The scoring around it (template, parser, fallback,
the run folder's record) is npu_rl/reward/judge.py.
"""

from __future__ import annotations

from npu_rl.config.derived import RunSettings
from npu_rl.config.reward_schema import JudgeRolloutConfig, RewardModelConfig
from npu_rl.config.schema import RolloutConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.device import get_backend
from npu_rl.models.loader import load_tokenizer, resolve_model_path
from npu_rl.parallel import dist
from npu_rl.rollout.base import SamplingParams
from npu_rl.rollout.factory import build_rollout_engine
from npu_rl.rollout.hf import HFRolloutEngine
from npu_rl.rollout.utils import to_plain


def judge_rollout_config(judge: JudgeRolloutConfig) -> RolloutConfig:
    """The vLLM engine's settings for the judge: one device, its weights read from its folder, sleep level 1 (the
    weights are kept, offloaded: nothing syncs them back)."""
    return RolloutConfig(name="vllm", dtype=str(judge.dtype), load_format="auto", tensor_model_parallel_size=1,
                         gpu_memory_utilization=float(judge.gpu_memory_utilization),
                         enforce_eager=bool(judge.enforce_eager), free_cache_engine=bool(judge.free_cache_engine),
                         sleep_level=1, max_model_len=judge.max_model_len or judge.prompt_length + judge.response_length,
                         prompt_length=int(judge.prompt_length), response_length=int(judge.response_length),
                         engine_kwargs=judge.engine_kwargs)


class JudgeWorker:
    def __init__(self, rm_cfg: RewardModelConfig, run_settings: RunSettings):
        self.cfg = rm_cfg
        self.run_settings = run_settings
        self.engine: HFRolloutEngine | None = None
        self.tokenizer = None

    @register(Dispatch.ALL)
    def init_model(self) -> None:
        if dist.rank() != 0:
            return
        rm, rollout = self.cfg, self.cfg.rollout
        folder = resolve_model_path(rm.model.path)
        self.tokenizer = load_tokenizer(folder, rm.model.trust_remote_code)
        if rollout.name == "vllm":
            self.engine = build_rollout_engine(judge_rollout_config(rollout), folder, None, self.tokenizer)
        else:
            self.engine = HFRolloutEngine.from_pretrained(
                folder, self.tokenizer.pad_token_id, dtype=rollout.dtype, device=get_backend().device(),
                generate_kwargs=to_plain(rollout.engine_kwargs.hf) or {})
        stop = [i for i in {self.tokenizer.eos_token_id} if i is not None]
        self.sampling = SamplingParams(temperature=float(rollout.temperature), top_p=float(rollout.top_p),
                                       top_k=-1 if rollout.top_k <= 0 else int(rollout.top_k),
                                       do_sample=bool(rollout.do_sample), stop_token_ids=stop)
        if rollout.free_cache_engine:
            self.engine.sleep()

    def dispatch_layout(self):
        return None

    @register(Dispatch.RANK0)
    def generate_texts(self, prompts: list[str]) -> list[str]:
        """The judge's reply to each user message (its chat template applied), special tokens dropped."""
        rollout = self.cfg.rollout
        ids = [self.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  tokenize=True) for p in prompts]
        ids = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in ids]
        for i, row in enumerate(ids):
            if len(row) > rollout.prompt_length:
                raise ValueError(f"judge prompt {i} is {len(row)} tokens, longer than reward_model.rollout."
                                 f"prompt_length={rollout.prompt_length}: raise it, or shorten "
                                 "reward_model.judge.prompt_template")
        if rollout.free_cache_engine:
            self.engine.wake_up()
        try:
            out = self.engine.generate_token_lists(ids, [int(rollout.response_length)] * len(ids), self.sampling)
        finally:
            if rollout.free_cache_engine:
                self.engine.sleep()
        return [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in out.completions]
