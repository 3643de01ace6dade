"""Scale-out building blocks: process group and mesh (dp x sp, ep), FSDP2, expert parallelism, Ulysses sequence
parallelism, remove-padding, token-budget batching, full-weight export and sharded checkpoints. See
docs/distributed.md.

Names are imported lazily (``from npu_rl.parallel import apply_fsdp2`` loads only what it needs), so a worker that
only builds a mesh does not pay for torch.distributed.checkpoint or transformers' attention modules.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "attention": ["VarlenLayout", "set_varlen_kernel", "use_varlen_attention", "varlen_attention"],
    "checkpoint": ["load_checkpoint", "merge_checkpoint", "save_checkpoint"],
    "dist": ["all_gather_objects", "all_reduce_sum", "default_group", "init_distributed", "is_distributed", "rank",
             "world_size"],
    "expert_parallel": ["apply_expert_parallel", "check_expert_parallel"],
    "fsdp": ["FSDPSettings", "apply_fsdp2", "apply_fsdp2_from_config", "clip_grad_norm", "load_optimizer",
             "offload_optimizer", "optimizer_on_device", "optimizer_step"],
    "mesh": ["ParallelMesh", "build_mesh", "check_parallel_sizes"],
    "packing": ["PackedInputs", "PackedSequences", "pad_output", "prepare_packed_inputs", "unpad_input"],
    "seqlen": ["balance_batch", "karmarkar_karp", "partition_by_token_budget", "restore_order",
               "split_by_token_budget"],
    "ulysses": ["SequenceShard", "all_to_all", "gather_sequence", "kv_repeat_factor"],
    "weights": ["export_hf_folder", "full_tensor", "iter_full_parameters", "save_hf_state_dict"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'npu_rl.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"npu_rl.parallel.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
