"""The training engine: one causal LM (or value model) on this rank's devices, trained or evaluated. Every role runs
on one: the actor and the critic train with it, the reference and the reward model only run forwards.

What it owns: the model runner (FSDP2 shards, or a master copy on one device), the optimizer and lr scheduler, the
micro-batched forward (fixed size or token budget, padding trimmed), the update loop and the checkpoint state. What
a role supplies: its forward (log-probs, values, scores) and, to train, a loss function of one micro-batch.

The update, for one step's batch on this rank::

    for epoch in ppo_epochs:
        rows = shuffled (seeded by the seed and the update count) when shuffle, else in order
        for mini-batch in rows (rows_per_mini_batch = ppo_mini_batch_size x n / dp):
            denominators = valid tokens / sequences of the mini-batch on ALL dp ranks   # one all-reduce
            for micro-batch in mini-batch (fixed size or token budget):
                loss = loss_fn(micro-batch, denominators)          # its share of the mini-batch mean
                (loss * dp).backward(); gradients into the fp32 master                  # FSDP averages over dp
            clip grads; skip the step (and count it) when the grad norm is not finite; optimizer.step()
    lr_scheduler.step(); update count += 1     (restored from the scheduler on load)
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from npu_rl.core import loss_denominators
from npu_rl.device import get_backend
from npu_rl.models import moe
from npu_rl.models.vision import MULTI_MODAL_KEY, ImageFeatures, encode_images, multi_modal_kwargs, vision_tower_frozen
from npu_rl.models.vision_dedup import images_deduplicated, vision_dedup
from npu_rl.models.forward import (
    LogprobOptions,
    packed_response_logprobs,
    packed_response_values,
    response_logprobs,
    response_values,
)
from npu_rl.parallel import dist
from npu_rl.parallel.packing import prepare_packed_inputs
from npu_rl.parallel.fsdp import clip_grad_norm
from npu_rl.protocol import Batch
from npu_rl.utils.lr_schedule import build_scheduler
from npu_rl.utils.metrics import mean_of
from npu_rl.workers.checkpointing import load_worker_state, save_worker_state
from npu_rl.workers.model_runner import (
    MicroBatching,
    ModelRunner,
    pad_right,
    restore_order,
    split_micro_batches,
    trimmed_inputs,
)


class MicroLoss(NamedTuple):
    """What a role's loss function returns for one micro-batch."""

    loss: torch.Tensor  # 0-d: this micro-batch's share of the mini-batch loss (global denominators)
    metrics: dict[str, torch.Tensor]  # averaged over the micro-batches of a mini-batch
    # Shares of a mini-batch quantity (the loss value itself): summed over micro-batches and times dp, so each
    # rank reports its estimate of the mini-batch mean and the ranks' mean is the mini-batch's value.
    shares: dict[str, torch.Tensor]
    # Extremes over the mini-batch: a key ending in ``_min`` takes the smallest micro-batch value, any other the
    # largest (verl's MIN / MAX metrics, e.g. ``actor/distillation/loss_min``)
    extremes: dict[str, torch.Tensor] = {}


LossFn = Callable[[Batch, dict[str, torch.Tensor]], MicroLoss]


@dataclass(frozen=True)
class Routing:
    """What one forward of a mixture-of-experts model does with its routers (npu_rl/models/moe.py)."""

    capture: bool = False  # keep the router logits and experts: load metrics, the auxiliary loss, the mismatch
    replay: bool = False  # route each token to the experts in the micro-batch's ``routed_experts`` [b, T, L, K]


@dataclass
class RoutedForward:
    """A forward's routing, captured: ``token_mask`` [N] (real tokens among the router's rows), ``recorded``
    [N, L, K] (the micro-batch's ``routed_experts``, or None) and the hooks holding the layers' records."""

    hooks: moe.RouterHooks
    token_mask: torch.Tensor
    recorded: torch.Tensor | None
    to_tokens: Callable[[torch.Tensor], torch.Tensor]  # [N, ...] -> [b, kept width, ...], -1 on padding
    kept_width: int  # the forward's columns: the last ``kept_width`` of the prompt + kept response
    kept_response: int  # response columns kept (trimmed_inputs)

    def routed_experts(self, full_width: int, response_width: int) -> torch.Tensor:
        """The experts this forward used, ``[b, full_width, L, K]`` int16 (-1 on padding and where nothing was
        routed)."""
        indices = self.hooks.stacked_indices().to(torch.int16).masked_fill(~self.token_mask.view(-1, 1, 1), -1)
        used = self.to_tokens(indices)  # [b, kept width, L, K]
        out = used.new_full((used.shape[0], full_width, *used.shape[2:]), -1)
        end = full_width - response_width + self.kept_response
        out[:, end - self.kept_width: end] = used
        return out

    def metrics(self, model: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
        """Load metrics (npu_rl.models.moe.load_metrics) and, with recorded experts, the share of (token, layer)
        pairs whose top-k the router would pick differently (``routing_mismatch``)."""
        hooks = self.hooks
        out = moe.load_metrics(moe.expert_load(hooks.stacked_indices(), self.token_mask, hooks.num_experts), prefix)
        if self.recorded is not None:
            out[f"{prefix}/routing_mismatch"] = moe.topk_mismatch(self.recorded, hooks.stacked_indices(natural=True),
                                                                  self.token_mask)
        return out


@dataclass(frozen=True)
class UpdateSettings:
    """How a trained role cuts and repeats its batch (from its config slice and the run settings)."""

    rows_per_mini_batch: int  # per rank
    micro: MicroBatching
    epochs: int  # ppo_epochs
    shuffle: bool
    grad_clip: float


OPTIMIZERS = ("adamw", "adam")  # optim.optimizer, any case: both build torch.optim.AdamW


def build_optimizer(model: torch.nn.Module, optim_config) -> torch.optim.Optimizer:
    """AdamW over the parameters that require gradients (``optim.lr``, ``betas``, ``eps``, ``weight_decay``); the
    implementation (fused / foreach) is the device layer's choice (``Backend.optimizer_kwargs``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=optim_config.lr, betas=tuple(optim_config.betas), eps=optim_config.eps,
                             weight_decay=optim_config.weight_decay, **get_backend().optimizer_kwargs(params))


class TrainingEngine:
    """See the module docstring. ``role`` prefixes the update's metrics (``actor/grad_norm`` ...)."""

    def __init__(self, model: torch.nn.Module, fsdp_config, *, role: str, response_length: int,
                 forward_micro: MicroBatching, sp_size: int = 1, use_remove_padding: bool = False,
                 optim_config=None, total_training_steps: int | None = None, update: UpdateSettings | None = None,
                 seed: int = 0, compile_blocks: bool = False, weights_folder: str | None = None):
        dist.init_distributed(single_process_group=False)
        self.role = role
        self.trainable = optim_config is not None
        if not self.trainable:
            model.requires_grad_(False)
        self.runner = ModelRunner(model, fsdp_config, self.trainable, sp_size, use_remove_padding, compile_blocks,
                                  weights_folder=weights_folder, init_seed=seed)
        self.router_hooks = moe.install_router_hooks(self.compute_model)  # None for a dense model
        self.response_length = response_length
        self.forward_micro = forward_micro
        self.update_settings = update
        self.seed = seed
        self.num_updates = 0
        # A Qwen-VL model: a pass encodes each prompt's images once (npu_rl.models.vision.ImageFeatures) where no
        # gradient reaches the vision tower; False: every micro-batch's forward runs it, on the micro-batch's distinct
        # images (npu_rl.models.vision_dedup; on every row's with NPU_RL_VISION_DEDUP=0)
        self.encode_images_once = True
        self.image_features: ImageFeatures | None = None  # set during a pass
        self.optimizer = self.scheduler = None
        if self.trainable:
            if update is None or total_training_steps is None:
                raise ValueError(f"{role}: a trained engine needs update settings and total_training_steps")
            self.optimizer = build_optimizer(self.model, optim_config)
            self.scheduler = build_scheduler(self.optimizer, optim_config, total_training_steps)

    # --------------------------------------------------------------------------------------------- the model
    @property
    def model(self) -> torch.nn.Module:
        """The weights the optimizer updates and checkpoints hold (fp32 master on one device, shards when sharded)."""
        return self.runner.model

    @property
    def compute_model(self) -> torch.nn.Module:
        """The module forwards run through (the compute-dtype copy on one device)."""
        return self.runner.compute_model

    @property
    def device(self) -> torch.device:
        return self.runner.device

    def dispatch_layout(self):
        return self.runner.dispatch_layout()

    # --------------------------------------------------------------------------------------------- forwards
    def _inputs(self, mb: Batch) -> tuple[tuple, int, dict[str, torch.Tensor]]:
        inputs, kept = trimmed_inputs(mb, self.response_length)
        device = self.device
        inputs = {k: v.to(device) for k, v in inputs.items()}
        return (self.compute_model, inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"],
                inputs["responses"]), kept, inputs

    def _image_inputs(self, mb: Batch) -> dict[str, torch.Tensor]:
        """A Qwen-VL micro-batch's image inputs (npu_rl.models.vision): its rows' features encoded with the pass
        (``mm_encoder_outputs``) when there are, else their ``pixel_values`` / ``image_grid_thw``; {} for text."""
        rows = mb.non_tensors.get(MULTI_MODAL_KEY)
        if rows is None:
            return {}
        if self.image_features is not None:
            return self.image_features.model_inputs(rows)
        return multi_modal_kwargs(rows, self.device, self.runner.param_dtype)

    def _images_deduplicated(self, mb: Batch, images: dict):
        """Around a forward handed a micro-batch's pixels: the vision tower computes each distinct image once and
        its features go to every row that shares it (npu_rl.models.vision_dedup; ``NPU_RL_VISION_DEDUP=0``: off)."""
        rows = mb.non_tensors.get(MULTI_MODAL_KEY) if "pixel_values" in images else None
        return vision_dedup(self.compute_model, rows)

    @contextlib.contextmanager
    def images_encoded_once(self, batch: Batch, *, training: bool = False):
        """Inside the block, the micro-batches of ``batch`` take their images' features from one vision forward over
        the batch's distinct image rows. Not in an update whose gradient reaches the vision tower (``training`` and
        the tower not frozen), with ``encode_images_once`` off, or for a model that cannot take the features."""
        rows = batch.non_tensors.get(MULTI_MODAL_KEY)
        wanted = (self.encode_images_once and rows is not None
                  and (not training or vision_tower_frozen(self.compute_model)))
        self.image_features = (encode_images(self.compute_model, rows, self.device, self.runner.param_dtype)
                               if wanted else None)
        try:
            yield self.image_features
        finally:
            self.image_features = None

    def _router_rows(self, inputs: dict[str, torch.Tensor]) -> tuple[Callable, Callable]:
        """Per-token ``[b, T, ...]`` -> ``[N, ...]`` in the order the routers see the tokens: flattened (padded
        forward) or packed and sliced for this Ulysses rank (the packed forward slices its inputs the same way);
        and back (-1 on padding)."""
        batch, width = inputs["input_ids"].shape
        if not self.runner.packed:
            return (lambda x: x.reshape(-1, *x.shape[2:])), (lambda rows: rows.reshape(batch, width, *rows.shape[1:]))
        packed = prepare_packed_inputs(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"],
                                       sp_group=self.runner.sp_group)
        return ((lambda x: packed.slice(x, pad_value=-1 if not x.is_floating_point() else 0)[0]),
                (lambda rows: packed.restore(rows.unsqueeze(0), pad_value=-1)))

    def _arm_routing(self, inputs: dict[str, torch.Tensor], kept: int, routing: Routing) -> RoutedForward | None:
        hooks = self.router_hooks
        if hooks is None:
            return None
        if not (routing.capture or routing.replay):
            hooks.clear()  # a forward that asks nothing of the routers: they choose, nothing is kept
            return None
        rows, unrows = self._router_rows(inputs)
        token_mask = rows(inputs["attention_mask"]).clamp(min=0).bool()
        recorded = rows(inputs["routed_experts"]) if "routed_experts" in inputs else None
        if routing.replay and recorded is None:
            raise ValueError("router replay: the batch has no routed_experts (rollout.enable_rollout_routing_replay "
                             "for R3, or the actor's recording pass for R2)")
        hooks.arm(capture=routing.capture, replay=recorded if routing.replay else None)
        return RoutedForward(hooks, token_mask, recorded, unrows, inputs["input_ids"].shape[1], kept)

    def forward_logprobs(self, mb: Batch, temperature: float, options: LogprobOptions
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Response log-probs [b, R] (and entropy [b, R] when ``options.compute_entropy``) of one micro-batch."""
        stats, _ = self.forward_logprob_stats(mb, temperature, options)
        return stats["logprobs"], stats.get("entropy")

    def forward_logprob_stats(self, mb: Batch, temperature: float, options: LogprobOptions,
                              routing: Routing = Routing(), topk_ids: torch.Tensor | None = None
                              ) -> tuple[dict[str, torch.Tensor], RoutedForward | None]:
        """``logprobs`` [b, R], ``entropy`` (``options.compute_entropy``) and ``sum_pi_squared``
        (``options.compute_sum_pi_squared``) of one micro-batch, from one forward; with ``options.topk`` = K also
        ``topk_logprobs`` [b, R, K] (at ``topk_ids`` [b, R, K] where given, else at the own top-k) and ``topk_ids``
        [b, R, K] (the own top-k); with an MoE model and ``routing``, that forward's routing (replay stays armed
        until the next forward: a backward's recompute)."""
        args, kept, inputs = self._inputs(mb)
        routed = self._arm_routing(inputs, kept, routing)
        want_spi = options.compute_sum_pi_squared
        gather = topk_ids[:, :kept].to(self.device) if topk_ids is not None else None
        images = self._image_inputs(mb)
        with self._images_deduplicated(mb, images):
            if self.runner.packed:
                out = packed_response_logprobs(*args, temperature, options, sp_group=self.runner.sp_group,
                                               return_sum_pi_squared=want_spi, model_inputs=images, topk_ids=gather)
            else:
                out = response_logprobs(*args, temperature, options, return_sum_pi_squared=want_spi,
                                        model_inputs=images, topk_ids=gather)
        names = ("logprobs", "entropy") + (("sum_pi_squared",) if want_spi else ()) + ("topk_logprobs", "topk_ids")
        stats = {name: pad_right(t, self.response_length) for name, t in zip(names, out) if t is not None}
        return stats, routed

    def clear_routing(self) -> None:
        """Disarm the router hooks (after an update or an inference pass)."""
        if self.router_hooks is not None:
            self.router_hooks.clear()

    def forward_values(self, mb: Batch) -> torch.Tensor:
        """Values V(s_t) [b, R] of one micro-batch (a value model), zero outside the response mask."""
        args, kept, _ = self._inputs(mb)
        args = (*args[:4], kept)
        if self.runner.packed:
            values = packed_response_values(*args, sp_group=self.runner.sp_group)
        else:
            values = response_values(*args)
        return pad_right(values, self.response_length) * mb["response_mask"].to(self.device)

    @torch.no_grad()
    def infer(self, batch: Batch, forward: Callable[[Batch], dict[str, torch.Tensor]]) -> Batch:
        """``forward`` over the micro-batches of ``batch`` in eval mode; its [b, ...] outputs, in row order, on the
        host."""
        self.runner.eval()
        micro_batches, permutation = split_micro_batches(batch, self.forward_micro)
        outputs: dict[str, list[torch.Tensor]] = {}
        with self.images_encoded_once(batch):
            for mb in micro_batches:
                for key, value in forward(mb).items():
                    outputs.setdefault(key, []).append(value.cpu())
        return Batch({key: restore_order(values, permutation) for key, values in outputs.items()})

    # --------------------------------------------------------------------------------------------- the update
    def update(self, batch: Batch, loss_fn: LossFn,
               after_step: Callable[[bool], dict[str, torch.Tensor]] | None = None) -> dict[str, float]:
        """Optimizer steps over ``batch`` (this rank's rows); metrics averaged over mini-batches (module docstring).
        ``after_step(stepped)`` runs after each mini-batch (``stepped``: the optimizer step was taken, not skipped)
        and returns metrics of its own (a role's work that follows the step, e.g. the router bias update)."""
        settings = self.update_settings
        self.runner.train()
        metrics: list[dict[str, torch.Tensor]] = []
        generator = torch.Generator().manual_seed(self.seed + self.num_updates)
        deduplicated = images_deduplicated(self.compute_model)  # None: no vision tower
        with self.images_encoded_once(batch, training=True):  # a frozen vision tower: its features stay the same
            for _ in range(settings.epochs):
                order = (torch.randperm(len(batch), generator=generator) if settings.shuffle
                         else torch.arange(len(batch)))
                for mini in batch.index(order).split(settings.rows_per_mini_batch):
                    metrics.append(self._update_mini_batch(mini, loss_fn))
                    if after_step is not None:
                        metrics[-1].update(after_step(bool(metrics[-1][f"{self.role}/nan_skipped"] == 0)))
        # the last step's gradients would otherwise stay allocated through the next rollout and log-prob passes
        # (a fp32 copy of every trainable weight, memory the rollout engine could use)
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():  # every update skipped (non-finite): the schedule still advances
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        self.num_updates += 1
        skipped = torch.stack([m.pop(f"{self.role}/nan_skipped") for m in metrics]).sum()
        out = mean_of(metrics)
        out[f"{self.role}/lr"] = torch.tensor(self.scheduler.get_last_lr()[0])
        out[f"{self.role}/nan_skipped"] = skipped
        if deduplicated is not None:  # a Qwen-VL model: copies its tower was handed in this update and skipped
            out[f"{self.role}/vision/images_deduplicated"] = torch.tensor(
                float(images_deduplicated(self.compute_model) - deduplicated))
        return {k: float(v) for k, v in out.items()}

    def _update_mini_batch(self, mini: Batch, loss_fn: LossFn) -> dict[str, torch.Tensor]:
        runner, dp = self.runner, self.runner.dp_size
        denominators = dist.all_reduce_sum(loss_denominators(mini["response_mask"]), runner.dp_group)
        denominators = {k: v.to(self.device) for k, v in denominators.items()}
        micro_batches, _ = split_micro_batches(mini, self.update_settings.micro)
        self.optimizer.zero_grad(set_to_none=True)
        results: list[MicroLoss] = []
        for mb in micro_batches:
            result = loss_fn(mb, denominators)
            (result.loss * dp).backward()
            runner.grads_to_master()
            results.append(MicroLoss(result.loss.detach(), result.metrics, result.shares, result.extremes))
        grad_norm = clip_grad_norm(self.model, self.update_settings.grad_clip)
        finite = math.isfinite(float(grad_norm))  # one host sync per mini-batch, to decide on the step
        if finite:
            runner.optimizer_step(self.optimizer)
        else:
            self.optimizer.zero_grad(set_to_none=True)
        out = mean_of([r.metrics for r in results])
        for key in results[0].shares:
            out[key] = torch.stack([r.shares[key].float() for r in results]).sum() * dp
        for key in results[0].extremes:
            values = torch.stack([r.extremes[key].detach().float() for r in results])
            out[key] = values.min() if key.endswith("_min") else values.max()
        out[f"{self.role}/grad_norm"] = grad_norm.detach().float()
        out[f"{self.role}/nan_skipped"] = torch.tensor(0.0 if finite else 1.0)
        return out

    # --------------------------------------------------------------------------------------------- checkpoints
    def save(self, path: str, contents, tokenizer=None, hf_files=()) -> None:
        save_worker_state(path, self.model, self.optimizer, self.scheduler, contents, tokenizer, hf_files=hf_files)

    def load(self, path: str, contents) -> None:
        """Weights, optimizer and scheduler (per ``contents``); the update count follows the scheduler, so the
        shuffle order after a resume is the one an uninterrupted run would have used."""
        load_worker_state(path, self.model, self.optimizer, self.scheduler, contents)
        self.runner.master_to_compute()
        if self.scheduler is not None and "extra" in contents:
            self.num_updates = self.scheduler.last_epoch
