"""Is a model folder whole? Checked at validation, before the data loads and long before ``from_pretrained`` would
fail with a library traceback (or, for a folder without tokenizer files, succeed and tokenize every prompt to nothing).

``model_folder_problems(folder)`` reads only file names, safetensors headers (a few KB) and the JSON files (tokenizer,
generation config), never the weights.
``model_path_problems(path)`` adds what comes before: the path exists, is a folder, is not empty, has a
``config.json`` that is a JSON object. Every command that takes a model folder (``train``'s validation,
``doctor --parity``, ``eval``, ``merge``) asks ``check_model_folder``, so they all say the same words.
"""

from __future__ import annotations

import glob
import json
import os
import re
import struct

from npu_rl.models.loader import is_builtin
from npu_rl.models.snapshot import json_problem, safetensors_problem

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tokenizer.tiktoken",
                   "qwen.tiktoken")


def model_folder_problems(folder: str, need_tokenizer: bool = True) -> list[str]:
    """Missing tokenizer files, missing or truncated weights; each message names the folder or file."""
    problems = []
    names = set(os.listdir(folder))
    if need_tokenizer and not any(n in names for n in TOKENIZER_FILES):
        problems.append(f"{folder} has no tokenizer files (one of {', '.join(TOKENIZER_FILES[:4])} ...): every prompt "
                        "would tokenize to nothing. Copy the tokenizer files of the base model into it")
    safetensors = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    bins = sorted(glob.glob(os.path.join(folder, "pytorch_model*.bin")))
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = os.path.join(folder, index_name)
        if os.path.isfile(index):
            try:
                with open(index, encoding="utf-8") as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError) as exc:
                problems.append(f"{index} is unreadable ({type(exc).__name__}: {exc})")
                continue
            problems += [f"{index} names {s}, which is missing" for s in shards
                         if not os.path.isfile(os.path.join(folder, s))]
    if not safetensors and not bins:
        problems.append(f"{folder} has config.json but no weights (*.safetensors or pytorch_model*.bin)")
    for path in safetensors:
        problem = safetensors_problem(path)
        if problem:
            problems.append(problem)
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):  # tokenizer, generation config ...
        if os.path.basename(path) not in ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"):
            problem = json_problem(path)  # (those three are read above, with their own messages)
            if problem:
                problems.append(problem)
    if not problems:
        problems += expert_tensor_problems(folder)
    return problems


# A routed expert's tensor in the Hugging Face layout: per expert (Qwen2/3-MoE, DeepSeek-V3: gate_proj / up_proj /
# down_proj; Mixtral: w1 / w2 / w3), or transformers 5's fused 3-D tensors (gate_up_proj, down_proj).
_EXPERT = re.compile(r"^(?P<layer>.*\.layers\.(?P<index>\d+)\.(?:mlp|block_sparse_moe)\.experts)\."
                     r"(?:(?P<expert>\d+)\.(?P<proj>\w+)\.weight|(?P<fused>gate_up_proj|down_proj))$")
MAX_MISSING_LISTED = 3


def _num_routed_experts(config: dict) -> int:
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return config[key]
    return 0


def moe_layer_indices(config: dict) -> list[int] | None:
    """The decoder layers with routed experts, from config.json (None: a model type this does not know)."""
    layers, kind = int(config.get("num_hidden_layers", 0)), config.get("model_type")
    if kind in ("qwen3_moe", "qwen2_moe"):
        step, dense = int(config.get("decoder_sparse_step", 1) or 1), set(config.get("mlp_only_layers") or [])
        return [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
    if kind in ("deepseek_v3", "deepseek_v2"):
        first, freq = int(config.get("first_k_dense_replace", 0)), int(config.get("moe_layer_freq", 1) or 1)
        return [i for i in range(layers) if i >= first and i % freq == 0]
    if kind == "mixtral":
        return list(range(layers))
    return None


def _tensor_files(folder: str) -> dict[str, str]:
    """Tensor name -> the safetensors file holding it (from the index, else the files' headers)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            return dict(json.load(f)["weight_map"])
    names = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            names.update({key: os.path.basename(path) for key in json.loads(f.read(header_len)) if key != "__metadata__"})
    return names


def expert_tensor_problems(folder: str) -> list[str]:
    """A mixture-of-experts checkpoint with an expert's tensor missing: each problem names the tensor and the file
    that holds the layer's other experts (safetensors only; reads the index or the headers, never the weights)."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        num_experts = _num_routed_experts(config)
        if not num_experts:
            return []
        files = _tensor_files(folder)
    except (OSError, ValueError, KeyError, struct.error):
        return []  # unreadable files are reported by model_folder_problems
    layers: dict[int, dict] = {}
    projections: set[str] = set()
    for name, file in files.items():
        match = _EXPERT.match(name)
        if match is None:
            continue
        layer = layers.setdefault(int(match["index"]), {"prefix": match["layer"], "file": file, "have": set(),
                                                        "fused": set()})
        if match["fused"]:
            layer["fused"].add(match["fused"])
        else:
            layer["have"].add((int(match["expert"]), match["proj"]))
            projections.add(match["proj"])
    if not layers:
        return [f"{folder}: config.json declares {num_experts} routed experts but the weights hold no expert tensor "
                f"(expected names such as model.layers.<i>.mlp.experts.<e>.gate_proj.weight)"]
    problems = []
    expected_layers = moe_layer_indices(config)
    prefix = next(iter(layers.values()))["prefix"]
    for index in sorted(set(expected_layers or []) - set(layers)):
        expected = re.sub(r"\.layers\.\d+\.", f".layers.{index}.", prefix)
        problems.append(f"{folder}: layer {index} has no expert tensors (expected {expected}.<0..{num_experts - 1}>.*); "
                        "config.json declares it a mixture-of-experts layer")
    for index, layer in sorted(layers.items()):
        if layer["fused"]:
            missing = sorted({"gate_up_proj", "down_proj"} - layer["fused"])
            names = [f"{layer['prefix']}.{proj}" for proj in missing]
        else:
            missing = sorted({(e, p) for e in range(num_experts) for p in projections} - layer["have"])
            names = [f"{layer['prefix']}.{e}.{p}.weight" for e, p in missing]
        if names:
            more = f" and {len(names) - MAX_MISSING_LISTED} more" if len(names) > MAX_MISSING_LISTED else ""
            problems.append(f"{folder}: expert tensor {', '.join(names[:MAX_MISSING_LISTED])}{more} missing (layer "
                            f"{index}'s other experts are in {layer['file']}; config.json declares {num_experts} "
                            "routed experts)")
    return problems


class ModelFolderError(ValueError):
    """A model folder that cannot be loaded; the message lists every problem, naming the key and the file."""


def config_json_problem(folder: str) -> str | None:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"{path} is not valid JSON ({type(exc).__name__}: {exc})"
    if not isinstance(config, dict):
        return f"{path} holds a JSON {type(config).__name__}, not an object"
    if "model_type" not in config and not config.get("architectures"):
        return f"{path} has neither model_type nor architectures: not a Hugging Face model config"
    return None


def model_path_problems(path: str, need_tokenizer: bool = True) -> list[str]:
    """Everything wrong with the model folder ``path`` (a built-in model name: nothing; it is converted on use)."""
    if is_builtin(str(path)):
        return []
    folder = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.exists(folder):
        return [f"{folder} does not exist"]
    if not os.path.isdir(folder):
        return [f"{folder} is a file, not a model folder (give the folder that holds config.json)"]
    if not os.listdir(folder):
        return [f"{folder} is empty: not a Hugging Face model folder (config.json, weights, tokenizer files)"]
    if not os.path.isfile(os.path.join(folder, "config.json")):
        return [f"{folder} has no config.json: not a Hugging Face model folder"]
    problem = config_json_problem(folder)
    return ([problem] if problem else []) + model_folder_problems(folder, need_tokenizer)


def check_model_folder(path: str, key: str, need_tokenizer: bool = True) -> None:
    """Raise ``ModelFolderError`` listing what is wrong with ``path`` (given as ``key``), or return."""
    problems = model_path_problems(path, need_tokenizer)
    if problems:
        raise ModelFolderError("; ".join(f"{key}: {p}" for p in problems))
