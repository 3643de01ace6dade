"""LoRA adapters streamed into vLLM as tensors (no files), for a LoRA actor.

vLLM is started with ``enable_lora`` (``max_lora_rank``: the smallest size vLLM accepts that holds the actor's
rank, ``max_loras=1``). After each update the actor's adapter tensors (PEFT names, full tensors) and its PEFT
config are handed over in-process: :func:`register_adapter` keeps them under a LoRA id, and vLLM's worker-side
loader (``WorkerLoRAManager._load_adapter``, wrapped once by :func:`install_tensor_loader`) builds the adapter with
``LoRAModel.from_lora_tensors`` instead of reading a folder. ``add_lora(..., load_inplace=True)`` replaces the
previous version under the same id; generation passes the request. This needs the engine core in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which npu-rl sets): the tensors never leave it. The base weights do not
change with LoRA; with ``load_format=dummy`` they are streamed once, before the first adapter.

The same idea as verl's ``TensorLoRARequest`` (an adapter carried as tensors); the code is npu-rl's own.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

ADAPTER_ID = 1
ADAPTER_NAME = "npu_rl_actor"
TENSOR_SCHEME = "npu_rl-tensors://"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks

_ADAPTERS: dict[int, tuple[dict[str, torch.Tensor], dict[str, Any]]] = {}
_LOCK = threading.Lock()
_INSTALLED = False


def max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    for size in VLLM_LORA_RANKS:
        if size >= rank:
            return size
    raise ValueError(f"actor_rollout_ref.model.lora_rank={rank} is above vLLM's largest max_lora_rank "
                     f"({VLLM_LORA_RANKS[-1]})")


def lora_llm_kwargs(rank: int) -> dict[str, Any]:
    return {"enable_lora": True, "max_lora_rank": max_lora_rank(rank), "max_loras": 1}


def peft_config_dict(config: Any) -> dict[str, Any]:
    """A PEFT ``LoraConfig`` as the plain dict vLLM's ``PEFTHelper.from_dict`` reads (sets become sorted lists)."""
    out = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    for key, value in list(out.items()):
        if isinstance(value, set):
            out[key] = sorted(value)
    return out


def register_adapter(tensors: dict[str, torch.Tensor], config: dict[str, Any], lora_id: int = ADAPTER_ID) -> str:
    """Keep ``tensors`` (PEFT keys) and ``config`` for vLLM's loader; returns the request path naming them."""
    with _LOCK:
        _ADAPTERS[lora_id] = (tensors, config)
    return f"{TENSOR_SCHEME}{lora_id}"


def install_tensor_loader() -> None:
    """Wrap vLLM's worker-side adapter loader once: an id registered here loads from tensors, any other request
    from its folder as before."""
    global _INSTALLED
    if _INSTALLED:
        return
    from vllm.lora import worker_manager
    from vllm.lora.peft_helper import PEFTHelper

    original = worker_manager.WorkerLoRAManager._load_adapter

    def _load_adapter(self, lora_request):
        path = getattr(lora_request, "lora_path", "") or ""
        if not path.startswith(TENSOR_SCHEME):
            return original(self, lora_request)
        with _LOCK:
            entry = _ADAPTERS.get(lora_request.lora_int_id)
        if entry is None:
            raise RuntimeError(f"vLLM asked for adapter {path}, but no tensors were registered for it")
        tensors, config = entry
        helper = PEFTHelper.from_dict(config)
        helper.validate_legal(self.lora_config)
        model = self._adapter_manager.model
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        return self._lora_model_cls.from_lora_tensors(
            lora_model_id=lora_request.lora_int_id, tensors=tensors, peft_helper=helper, device="cpu",
            dtype=self.lora_config.lora_dtype, model_vocab_size=self.vocab_size,
            weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
            skip_prefixes=getattr(model, "lora_skip_prefixes", None))

    worker_manager.WorkerLoRAManager._load_adapter = _load_adapter
    _INSTALLED = True


def lora_request(lora_id: int = ADAPTER_ID, load_inplace: bool = False):
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, lora_id, f"{TENSOR_SCHEME}{lora_id}", load_inplace=load_inplace)
