"""The embedded model is converted once per machine even when several processes (ranks) start together."""

from __future__ import annotations

import json
import os
import threading
import time

from npu_rl.models import loader


def test_concurrent_first_uses_convert_once(tmp_path, monkeypatch):
    out_dir = str(tmp_path / "smollm2-135m-instruct")
    calls = []

    def fake_convert(name, folder):  # what the real conversion leaves: a complete folder, renamed into place
        calls.append(name)
        time.sleep(0.3)  # long enough that the other caller arrives while this one is converting
        os.makedirs(folder)
        open(os.path.join(folder, "config.json"), "w").write("{}")

    monkeypatch.setattr(loader, "_convert_gguf_locked", fake_convert)
    threads = [threading.Thread(target=loader._convert_gguf, args=("smollm2-135m-instruct", out_dir))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert calls == ["smollm2-135m-instruct"]  # without the lock: three conversions, and os.makedirs fails twice
    assert os.path.isfile(os.path.join(out_dir, "config.json"))


def test_a_cached_conversion_gets_chatml_end_token(tmp_path, monkeypatch, caplog):
    """A folder converted by transformers 5.17 says <|im_start|> is the end token (seen on the H200): the next
    resolve corrects tokenizer_config.json's eos_token and nothing else; the real conversion sets it from the start
    (the embedded default's tests load it)."""
    monkeypatch.setenv("NPU_RL_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_start|>", "bos_token": "<|im_start|>",
                                                             "pad_token": "<|im_end|>"}))
    assert loader.resolve_model_path("SmolLM2-135M-Instruct") == str(folder)
    assert json.loads((folder / "tokenizer_config.json").read_text()) == {
        "eos_token": "<|im_end|>", "bos_token": "<|im_start|>", "pad_token": "<|im_end|>"}
    before = (folder / "tokenizer_config.json").stat().st_mtime_ns
    loader.resolve_model_path("smollm2-135m-instruct")  # already right: not rewritten
    assert (folder / "tokenizer_config.json").stat().st_mtime_ns == before


def _tiny_gguf(path: str) -> str:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_conversion_parses_the_gguf_file_once_and_builds_each_name_map_once(tmp_path):
    import gguf

    path = _tiny_gguf(str(tmp_path / "tiny.gguf"))
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "llama")
    with loader.gguf_parsed_once():
        first = gguf.GGUFReader(path)  # looked up on the module at call time, as transformers does
        assert gguf.GGUFReader(str(tmp_path / "." / "tiny.gguf")) is first  # one reader per file
        assert first.tensors[0].name == "token_embd.weight"
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 3) is not gguf.get_tensor_name_map(arch, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)  # restored
    assert gguf.GGUFReader(path) is not first
