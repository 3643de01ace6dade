"""Scale-out building blocks: process group and mesh (dp x sp), FSDP2, Ulysses sequence parallelism,
remove-padding, token-budget batching, full-weight export and sharded checkpoints. See docs/distributed.md."""

from npu_rl.parallel.attention import VarlenLayout, set_varlen_kernel, use_varlen_attention, varlen_attention
from npu_rl.parallel.checkpoint import load_checkpoint, merge_checkpoint, save_checkpoint
from npu_rl.parallel.fsdp import (
    FSDPSettings,
    apply_fsdp2,
    clip_grad_norm,
    load_model,
    load_optimizer,
    offload_model,
    offload_optimizer,
    optimizer_on_device,
    optimizer_step,
)
from npu_rl.parallel.mesh import ParallelMesh, build_mesh, check_parallel_sizes, init_distributed
from npu_rl.parallel.packing import PackedInputs, PackedSequences, pad_output, prepare_packed_inputs, unpad_input
from npu_rl.parallel.seqlen import (
    balance_batch,
    karmarkar_karp,
    partition_by_token_budget,
    restore_order,
    split_by_token_budget,
)
from npu_rl.parallel.ulysses import SequenceShard, all_to_all, gather_sequence, kv_repeat_factor
from npu_rl.parallel.weights import export_hf_folder, full_tensor, iter_full_parameters, save_hf_state_dict

__all__ = [
    "FSDPSettings",
    "PackedInputs",
    "PackedSequences",
    "ParallelMesh",
    "SequenceShard",
    "VarlenLayout",
    "all_to_all",
    "apply_fsdp2",
    "balance_batch",
    "build_mesh",
    "check_parallel_sizes",
    "clip_grad_norm",
    "export_hf_folder",
    "full_tensor",
    "gather_sequence",
    "init_distributed",
    "iter_full_parameters",
    "karmarkar_karp",
    "kv_repeat_factor",
    "load_checkpoint",
    "load_model",
    "load_optimizer",
    "merge_checkpoint",
    "offload_model",
    "offload_optimizer",
    "optimizer_on_device",
    "optimizer_step",
    "pad_output",
    "partition_by_token_budget",
    "prepare_packed_inputs",
    "restore_order",
    "save_checkpoint",
    "save_hf_state_dict",
    "set_varlen_kernel",
    "split_by_token_budget",
    "unpad_input",
    "use_varlen_attention",
    "varlen_attention",
]
