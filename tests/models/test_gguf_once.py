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
