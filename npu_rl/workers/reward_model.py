"""A model-based reward: an HF sequence-classification folder (one label) scores each prompt + response.

``reward_model.enable=True`` with ``reward_model.model.path``. The score is the model's output at the last token
of the sequence and replaces the rule score (as in verl), placed on the last valid response token.

Tokenizers: when the reward model has its own tokenizer (``reward_model.model.path`` holds one that differs from
the policy's), the conversation is rebuilt as text (the prompt's chat messages when the batch carries
``raw_prompt`` (``data.return_raw_chat=True``), else the decoded prompt) plus the decoded response, and tokenized
with the reward model's chat template. With the same tokenizer the policy's token ids are scored directly.
"""

from __future__ import annotations

import torch

from npu_rl.config.derived import RunSettings
from npu_rl.config.reward_schema import RewardModelConfig
from npu_rl.controller.dispatch import Dispatch, register
from npu_rl.models.loader import load_tokenizer, resolve_model_path
from npu_rl.utils.dtypes import to_dtype
from npu_rl.protocol import Batch
from npu_rl.workers.engine import TrainingEngine
from npu_rl.workers.model_runner import MicroBatching, sharded_load_folder


def load_reward_model(path: str, dtype: str, trust_remote_code: bool = False, device: str | None = None):
    """The scoring model; ``device="meta"``: built without weights, for the sharded load (sharded_load_folder)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    folder = resolve_model_path(path)
    if device == "meta":
        from accelerate import init_empty_weights

        config = AutoConfig.from_pretrained(folder, num_labels=1, trust_remote_code=trust_remote_code)
        with init_empty_weights(include_buffers=False):
            model = AutoModelForSequenceClassification.from_config(config, dtype=to_dtype(dtype),
                                                                   trust_remote_code=trust_remote_code)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(
            folder, num_labels=1, dtype=to_dtype(dtype), trust_remote_code=trust_remote_code)
    model.requires_grad_(False)
    return model


def _score_head(model) -> torch.nn.Module:
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if head is None:
        raise TypeError(f"{type(model).__name__} has no 'score' or 'classifier' head: not a sequence-classification "
                        "model (reward_model.model.path)")
    return head


class RewardModelWorker:
    def __init__(self, rm_cfg: RewardModelConfig, run_settings: RunSettings):
        self.cfg = rm_cfg
        self.run_settings = run_settings
        self.engine: TrainingEngine | None = None

    @register(Dispatch.ALL)
    def init_model(self) -> None:
        rm = self.cfg
        weights_folder = sharded_load_folder(rm.model.path)  # several ranks: built on meta, read shard by shard
        model = load_reward_model(rm.model.path, rm.model.fsdp_config.model_dtype, rm.model.trust_remote_code,
                                  device="meta" if weights_folder else None)
        micro = MicroBatching(self.run_settings.micro_batches.reward_model, rm.use_dynamic_bsz,
                              rm.forward_max_token_len_per_gpu)
        self.engine = TrainingEngine(model, rm.model.fsdp_config, role="reward_model",
                                     response_length=self.run_settings.max_response_length, forward_micro=micro,
                                     seed=self.run_settings.seed, weights_folder=weights_folder)
        self.tokenizer = load_tokenizer(rm.model.path, rm.model.trust_remote_code)
        self.tokenizer.padding_side = "right"  # the score is read at the last real token
        self.policy_tokenizer = load_tokenizer(rm.model.input_tokenizer or self.run_settings.policy_model_path)
        self.same_tokenizer = self.policy_tokenizer.get_vocab() == self.tokenizer.get_vocab()

    def dispatch_layout(self):
        return self.engine.dispatch_layout() if self.engine is not None else None

    def _texts(self, batch: Batch) -> list[str]:
        texts = []
        for i in range(len(batch)):
            response = batch["responses"][i][batch["response_mask"][i].bool()]
            answer = self.policy_tokenizer.decode(response, skip_special_tokens=True)
            if "raw_prompt" in batch:
                messages = list(batch["raw_prompt"][i]) + [{"role": "assistant", "content": answer}]
                texts.append(self.tokenizer.apply_chat_template(messages, tokenize=False))
            else:
                prompt = batch["prompts"][i][batch["attention_mask"][i, : batch["prompts"].shape[1]].bool()]
                texts.append(self.policy_tokenizer.decode(prompt, skip_special_tokens=False) + answer)
        return texts

    def _encode(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.same_tokenizer:
            # Policy ids as they are; right-align is not needed: the model reads the last non-pad position from
            # the attention mask passed in.
            return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        max_length = self.cfg.max_length
        return self.tokenizer(self._texts(batch), return_tensors="pt", padding=True, truncation=max_length is not None,
                              max_length=max_length, add_special_tokens=False)

    def _scores(self, mb: Batch) -> torch.Tensor:
        """Sequence scores [b]: the trunk, then the head at the last attended position (right for left- and
        right-padded rows alike; the HF class finds "the last non-pad token" by pad id, which is wrong when pad is
        the end-of-turn token)."""
        model, device = self.engine.compute_model, self.engine.device
        enc = self._encode(mb)
        mask = enc["attention_mask"].to(device)
        # Sharded over several ranks (FSDP2), the root's own parameters (embeddings, final norm, the head) are
        # gathered by the root's forward hook, which calling the trunk and the head apart skips: gather them here.
        sharded = hasattr(model, "unshard") and hasattr(model, "reshard")
        if sharded:
            model.unshard()
        try:
            out = model.base_model(input_ids=enc["input_ids"].to(device), attention_mask=mask, use_cache=False)
            last = mask.shape[1] - 1 - mask.flip(-1).float().argmax(-1)  # [b]
            hidden = out.last_hidden_state[torch.arange(len(last), device=device), last]  # [b, H]
            return _score_head(model)(hidden).squeeze(-1).float()
        finally:
            if sharded:
                model.reshard()

    @register(Dispatch.DP_SPLIT, pad_rows=True)
    def compute_rm_scores(self, batch: Batch) -> Batch:
        """``token_level_scores`` [B, R]: the reward model's score on each row's last valid response token."""
        seq_scores = self.engine.infer(batch, lambda mb: {"rm_scores": self._scores(mb)})["rm_scores"]  # [B]
        response_mask = batch["response_mask"]
        last_response = (response_mask.sum(-1) - 1).clamp(min=0)
        token_level = torch.zeros(response_mask.shape, dtype=torch.float32)
        token_level[torch.arange(len(batch)), last_response] = seq_scores
        return Batch({"token_level_scores": token_level, "rm_scores": seq_scores})
