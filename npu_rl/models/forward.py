"""Log-probs and entropy of response tokens, without materialising logits for the prompt.

The model's ``lm_head`` is swapped, for the duration of one forward, for a function that receives the final
hidden states and the (unsharded, under FSDP2) output weight and returns per-token log-probs and entropy directly.
So the same code serves a plain module, an FSDP2-sharded one and tied embeddings, and the fused kernels
(``npu_rl.kernels``) plug in without ever holding [tokens x vocab]. The plain path computes logits for the
response positions only, in chunks of rows, as the reference.

Shapes: ``input_ids`` [B, T] = prompt (left-padded) + response (right-padded); ``responses`` [B, R] are its last R
columns. Position t's hidden state predicts token t+1, so the response log-probs come from positions
T-R-1 .. T-2. A Qwen-VL model's rows (``npu_rl.models.vision``) add ``position_ids`` [B, 3, T] and the image inputs
(``model_inputs``: ``pixel_values``, ``image_grid_thw``); both paths take them (the packed one without Ulysses).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import npu_rl.kernels
from npu_rl.models.lora import output_bias, output_weight
from npu_rl.models.vision import model_position_ids
from npu_rl.parallel.packing import prepare_packed_inputs


@dataclass
class LogprobOptions:
    compute_entropy: bool = False
    use_fused_kernels: bool = False
    fused_backend: str = "torch"  # torch | triton (npu_rl.kernels)
    chunk_rows: int = 4096  # rows of [rows x vocab] logits at a time on the plain path
    # sum_v pi_v^2 of the tempered distribution per token (the optimal-token-baseline estimators; verl's
    # actor.calculate_sum_pi_squared). Plain path only: the fused kernels do not produce it.
    compute_sum_pi_squared: bool = False
    # k > 0: also the top-k of the tempered distribution per token (on-policy distillation's forward_kl_topk): its
    # own top-k token ids and the log-probs at the ids the caller gives (``topk_ids``: the student's log-probs at
    # the teacher's top-k), or at its own top-k where it gives none (the teacher's). Plain path only.
    topk: int = 0


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, compute_entropy: bool):
    """``logits`` [N, V] (any float dtype), ``targets`` [N] -> (logprobs [N], entropy [N] | None), in float32."""
    logits = logits.float()
    logsumexp = torch.logsumexp(logits, dim=-1)  # [N]
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logsumexp
    entropy = None
    if compute_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = logsumexp - (probs * logits).sum(-1)  # H = log Z - E_p[logit]
    return logprobs, entropy


def tempered_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    temperature: torch.Tensor | float) -> torch.Tensor:
    """``F.linear(hidden, weight, bias).float() / temperature`` [N, V] with one float32 buffer of [N x V], not two:
    the float32 logits are a fresh tensor that nothing saves for the backward (the matmul saves its inputs, the
    cast and a division by a constant save nothing), so the division runs in place; at temperature 1.0 (the
    rollout default) it is skipped. ``temperature``: a number or a [N, 1] tensor without gradient."""
    logits = F.linear(hidden, weight, bias).float()
    if isinstance(temperature, torch.Tensor):
        if temperature.requires_grad or torch.result_type(logits, temperature) != logits.dtype:
            return logits / temperature
        return logits.div_(temperature)
    return logits if temperature == 1 else logits.div_(temperature)


def plain_linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          targets: torch.Tensor, temperature: torch.Tensor | float, compute_entropy: bool,
                          chunk_rows: int):
    """Reference path: logits for ``chunk_rows`` rows at a time. hidden [N, H], weight [V, H], targets [N]."""
    out_lp, out_ent = [], []
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        temp = temperature[rows].unsqueeze(-1) if isinstance(temperature, torch.Tensor) else temperature
        lp, ent = logprobs_from_logits(tempered_logits(hidden[rows], weight, bias, temp), targets[rows],
                                       compute_entropy)
        out_lp.append(lp)
        out_ent.append(ent)
    logprobs = torch.cat(out_lp)
    return logprobs, (torch.cat(out_ent) if compute_entropy else None)


def plain_linear_sum_pi_squared(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                temperature: torch.Tensor | float, chunk_rows: int) -> torch.Tensor:
    """``sum_v softmax(logits / T)_v^2`` [N] for hidden [N, H], weight [V, H], in float32, ``chunk_rows`` at a time."""
    out = []
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        temp = temperature[rows].unsqueeze(-1) if isinstance(temperature, torch.Tensor) else temperature
        out.append(torch.softmax(tempered_logits(hidden[rows], weight, bias, temp), dim=-1).square().sum(-1))
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


def plain_linear_topk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      temperature: torch.Tensor | float, k: int, gather_ids: torch.Tensor | None,
                      chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [N, K] float32, own top-k ids [N, K]) of ``softmax(logits / T)`` for hidden [N, H], weight
    [V, H]: the log-probs at ``gather_ids`` [N, K] where given (with gradient), else at the row's own top-k;
    ``chunk_rows`` rows of logits at a time (no [N, V] buffer beyond a chunk)."""
    out_lp, out_ids = [], []
    for start in range(0, hidden.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        temp = temperature[rows].unsqueeze(-1) if isinstance(temperature, torch.Tensor) else temperature
        logprobs = torch.log_softmax(tempered_logits(hidden[rows], weight, bias, temp), dim=-1)
        own = torch.topk(logprobs.detach(), k=k, dim=-1).indices
        out_lp.append(logprobs.gather(-1, own if gather_ids is None else gather_ids[rows].long()))
        out_ids.append(own)
    if not out_lp:
        empty = hidden.new_zeros(0, k, dtype=torch.float32)
        return empty, empty.long()
    return torch.cat(out_lp), torch.cat(out_ids)


def _output_weight_and_bias(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output layer's weight and bias; a LoRA on the output layer (a PEFT layer around it) contributes its
    ``scale * B @ A`` while its adapter is on, so both kernels see the effective weight."""
    if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
        return output_weight(module), output_bias(module)
    return module.weight, getattr(module, "bias", None)


def _head_fn(targets: torch.Tensor, temperature, options: LogprobOptions,
             rows: torch.Tensor | None = None, topk_ids: torch.Tensor | None = None) -> Callable:
    """What the swapped lm_head computes: [B, S, H] -> [B, S, 2] = (logprob, entropy) of ``targets`` [B, S], or
    [B, S, 3] with sum_v pi_v^2 next when ``options.compute_sum_pi_squared``, then with ``options.topk`` = K, 2K
    more: the log-probs at ``topk_ids`` [B, S, K] (or at the own top-k) and the own top-k ids (as floats: exact
    below 2^24).
    ``rows`` [B, S] (bool): compute only there (zeros elsewhere): the packed path keeps prompt tokens off the
    vocabulary projection."""

    def head(module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = hidden.shape
        flat_hidden = hidden.reshape(-1, dim)
        flat_targets = targets.reshape(-1)
        temp = temperature.reshape(-1) if isinstance(temperature, torch.Tensor) else temperature
        flat_gather = topk_ids.reshape(-1, topk_ids.shape[-1]) if topk_ids is not None else None
        if rows is not None:
            keep = rows.reshape(-1).nonzero().squeeze(-1)
            flat_hidden, flat_targets = flat_hidden[keep], flat_targets[keep]
            temp = temp[keep] if isinstance(temp, torch.Tensor) else temp
            flat_gather = flat_gather[keep] if flat_gather is not None else None
        if options.use_fused_kernels and options.compute_sum_pi_squared:
            raise ValueError("sum_pi_squared (actor.calculate_sum_pi_squared) is computed on the plain path only; "
                             "set actor_rollout_ref.model.use_fused_kernels=False")
        if options.use_fused_kernels and options.topk:
            raise ValueError("the top-k log-probs (distillation.distillation_loss.loss_mode=forward_kl_topk) are "
                             "computed on the plain path only; set actor_rollout_ref.model.use_fused_kernels=False")
        weight, bias = _output_weight_and_bias(module)
        if options.use_fused_kernels:
            logprobs, entropy = npu_rl.kernels.linear_logprob_entropy(
                flat_hidden, weight, flat_targets, temperature=temp, backend=options.fused_backend)
            if not options.compute_entropy:
                entropy = None
        else:
            logprobs, entropy = plain_linear_logprobs(flat_hidden, weight, bias,
                                                      flat_targets, temp, options.compute_entropy,
                                                      options.chunk_rows)
        if entropy is None:
            entropy = torch.zeros_like(logprobs)
        channels = [logprobs, entropy]
        if options.compute_sum_pi_squared:
            channels.append(plain_linear_sum_pi_squared(flat_hidden, weight, bias, temp, options.chunk_rows))
        if options.topk:
            top_lp, top_ids = plain_linear_topk(flat_hidden, weight, bias, temp, options.topk, flat_gather,
                                                options.chunk_rows)
            channels += [*top_lp.unbind(-1), *top_ids.float().unbind(-1)]
        out = torch.stack(channels, dim=-1)
        if rows is not None:
            out = out.new_zeros(batch * seq, len(channels)).index_put((keep,), out)
        return out.view(batch, seq, len(channels))

    return head


@contextlib.contextmanager
def swapped_lm_head(model: torch.nn.Module, head: Callable):
    """Inside the block, ``model``'s output layer computes ``head(module, hidden)`` instead of logits."""
    lm_head = model.get_output_embeddings()
    if lm_head is None:
        raise TypeError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None)")
    original = lm_head.forward
    lm_head.forward = lambda hidden: head(lm_head, hidden)
    try:
        yield
    finally:
        lm_head.forward = original


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    position_ids: torch.Tensor,  # [B, T]
    responses: torch.Tensor,  # [B, R]
    temperature: torch.Tensor | float = 1.0,  # float, or per-token [B, R]
    options: LogprobOptions | None = None,
    return_sum_pi_squared: bool = False,
    model_inputs: dict[str, torch.Tensor] | None = None,
    topk_ids: torch.Tensor | None = None,  # [B, R, K]: with options.topk, the ids whose log-probs to return
) -> tuple[torch.Tensor, ...]:
    """(logprobs [B, R], entropy [B, R] or None) of ``responses`` under ``model``; entropy at ``temperature``.
    With ``return_sum_pi_squared`` (needs ``options.compute_sum_pi_squared``) a third item, sum_v pi_v^2 [B, R].
    With ``options.topk`` = K, two items more: the log-probs [B, R, K] at ``topk_ids`` (or at the own top-k where
    ``topk_ids`` is None) and the own top-k ids [B, R, K] (long), both at ``temperature``.
    ``model_inputs``: more keyword arguments of the model's forward (a Qwen-VL model's ``pixel_values`` and
    ``image_grid_thw``); ``position_ids`` may be [B, 3, T] (3-D rotary ids)."""
    options = options or LogprobOptions()
    response_length = responses.shape[1]
    # Targets for the R+1 kept positions: the R response tokens, plus a dummy for the last position (dropped).
    targets = torch.cat([responses, responses[:, -1:]], dim=1)
    if isinstance(temperature, torch.Tensor) and temperature.dim() == 2:
        temperature = torch.cat([temperature, temperature[:, -1:]], dim=1).float()
    if topk_ids is not None:
        topk_ids = torch.cat([topk_ids, topk_ids[:, -1:]], dim=1)
    with swapped_lm_head(model, _head_fn(targets, temperature, options, topk_ids=topk_ids)):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=model_position_ids(position_ids),
                    use_cache=False, logits_to_keep=response_length + 1, **(model_inputs or {}))
    packed = out.logits[:, :-1]  # [B, R, channels]
    return _split_channels(packed, options, return_sum_pi_squared)


def _split_channels(packed: torch.Tensor, options: LogprobOptions, return_sum_pi_squared: bool) -> tuple:
    logprobs = packed[..., 0]
    entropy = packed[..., 1] if options.compute_entropy else None
    out: tuple = (logprobs, entropy)
    if return_sum_pi_squared:
        if not options.compute_sum_pi_squared:
            raise ValueError("return_sum_pi_squared needs LogprobOptions(compute_sum_pi_squared=True)")
        out += (packed[..., 2],)
    if options.topk:
        first = 3 if options.compute_sum_pi_squared else 2
        k = options.topk
        out += (packed[..., first:first + k], packed[..., first + k:first + 2 * k].detach().round().long())
    return out


def packed_response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    position_ids: torch.Tensor,  # [B, T]
    responses: torch.Tensor,  # [B, R]
    temperature: torch.Tensor | float = 1.0,
    options: LogprobOptions | None = None,
    sp_group=None,
    return_sum_pi_squared: bool = False,
    model_inputs: dict[str, torch.Tensor] | None = None,
    topk_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """:func:`response_logprobs` without padding (``model.use_remove_padding``) and, with ``sp_group``, with the
    packed sequence split over the Ulysses group. The model must use ``npu_rl.parallel.use_varlen_attention``.

    Every per-token tensor (targets, temperature, the rows to project) is sliced exactly like the input ids, so each
    rank's hidden states line up with their own targets and temperatures (verl #5957 sliced the ids only).
    """
    options = options or LogprobOptions()
    rotary_3d = position_ids.dim() == 3  # [B, 3, T]: a Qwen-VL model
    if rotary_3d and sp_group is not None and torch.distributed.get_world_size(sp_group) > 1:
        raise ValueError("Ulysses with 3-D rotary ids (a Qwen-VL model) is not built; set "
                         "ulysses_sequence_parallel_size=1")
    batch, width = input_ids.shape
    response_length = responses.shape[1]
    inputs = prepare_packed_inputs(input_ids, attention_mask, None if rotary_3d else position_ids, sp_group=sp_group)
    model_position_ids = inputs.position_ids
    if rotary_3d:  # each axis packed like the ids: [3, 1, total]
        keep = inputs.packed.indices
        model_position_ids = position_ids.transpose(0, 1).reshape(3, -1)[:, keep].unsqueeze(1)
    targets = inputs.slice(torch.roll(input_ids, shifts=-1, dims=1))  # position t predicts token t + 1
    wanted = torch.zeros_like(attention_mask, dtype=torch.bool)
    wanted[:, width - response_length - 1: width - 1] = True  # the positions that predict response tokens
    rows = inputs.slice(wanted & attention_mask.bool())
    if isinstance(temperature, torch.Tensor) and temperature.dim() == 2:  # [B, R] -> [B, T] aligned to positions
        per_position = temperature.new_ones(batch, width)
        per_position[:, width - response_length - 1: width - 1] = temperature
        temperature = inputs.slice(per_position.float(), pad_value=1.0)
    if topk_ids is not None:  # [B, R, K] -> [B, T, K] aligned to the positions that predict them
        per_position = topk_ids.new_zeros(batch, width, topk_ids.shape[-1])
        per_position[:, width - response_length - 1: width - 1] = topk_ids
        topk_ids = inputs.slice(per_position)
    with inputs.attention() as layout, swapped_lm_head(model, _head_fn(targets, temperature, options, rows,
                                                                        topk_ids)):
        out = model(input_ids=inputs.input_ids, position_ids=model_position_ids, use_cache=False,
                    npu_rl_varlen_layout=layout, **(model_inputs or {}))
    full = inputs.restore(out.logits)  # [B, T, channels], gathered over the sp group
    packed = full[:, width - response_length - 1: width - 1]
    return _split_channels(packed, options, return_sum_pi_squared)


def packed_response_values(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           position_ids: torch.Tensor, response_length: int, sp_group=None) -> torch.Tensor:
    """:func:`response_values` without padding (and split over the Ulysses group)."""
    inputs = prepare_packed_inputs(input_ids, attention_mask, position_ids, sp_group=sp_group)
    with inputs.attention() as layout:
        out = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids, use_cache=False,
                    npu_rl_varlen_layout=layout)
    values = inputs.restore(out.logits)[:, -response_length - 1:-1]  # [B, R, 1]
    return values.squeeze(-1).float()


def response_values(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """Critic values [B, R]: V(s_t) read at the position before each response token (a token-classification
    model with one label, as verl's critic)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    values = out.logits[:, -response_length - 1:-1]
    return values.squeeze(-1).float()
