"""load_tokenizer reads a folder's tokenizer once per process: the trainer and the colocated actor both ask before
the first step (0.5 s each for SmolLM2 on one CPU); each caller gets its own copy, and a folder that changed is read
again."""

from __future__ import annotations

import os
import shutil

import transformers

from npu_rl.models import loader


def test_a_second_load_copies_instead_of_reading_again(tiny_model_dir, tmp_path, monkeypatch):
    folder = str(tmp_path / "model")
    shutil.copytree(tiny_model_dir, folder)
    reads = []
    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    first = loader.load_tokenizer(folder)
    first.padding_side = "right"  # a caller's change (the reward model's worker does this) stays its own
    second = loader.load_tokenizer(folder)
    assert reads == [folder]
    assert second is not first and second.padding_side == "left"
    assert second("1 + 1 = 2")["input_ids"] == first("1 + 1 = 2")["input_ids"]
    assert loader.load_tokenizer(folder, custom_chat_template="{{ 'x' }}").chat_template == "{{ 'x' }}"
    assert len(reads) == 2  # another template: read with it

    config = os.path.join(folder, "tokenizer_config.json")
    with open(config, "a", encoding="utf-8") as f:
        f.write("\n")  # the folder changed (size, mtime): read again
    loader.load_tokenizer(folder)
    assert len(reads) == 3
