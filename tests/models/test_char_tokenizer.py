"""The tests' character tokenizer survives the trip through a model folder: transformers (5.17, and 5.19 where the
config says ``model_type: qwen2``) loads such a folder as ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from the
vocabulary. Spelled in raw characters, every space and newline was lost there, and verl's Qwen chat builder refused
the tokenizer ("\\n" encoded to no token)."""

from __future__ import annotations

import json
import os

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from npu_rl.models.loader import load_tokenizer
from npu_rl.models.synthetic import char_tokenizer, save_random_model

TEXT = "a b\n\tc ~{}"


def test_one_token_a_character_before_and_after_a_model_folder(tmp_path):
    made = char_tokenizer()
    folder = save_random_model(str(tmp_path / "model"), "tiny")
    loaded = AutoTokenizer.from_pretrained(folder)
    for tokenizer in (made, loaded):
        ids = tokenizer.encode(TEXT, add_special_tokens=False)
        assert len(ids) == len(TEXT), (type(tokenizer).__name__, ids)
        assert tokenizer.decode(ids) == TEXT
        assert tokenizer.encode("\n", add_special_tokens=False) == [made.convert_tokens_to_ids("\u010a")]
    assert loaded.encode(TEXT, add_special_tokens=False) == made.encode(TEXT, add_special_tokens=False)
    chat = [{"role": "user", "content": "1 + 2"}]
    assert (loaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == "<|im_start|>user\n1 + 2<|im_end|>\n<|im_start|>assistant\n")


def _raw_character_folder(folder: str) -> str:
    """The char tokenizer as it was before: space and newline spelled as raw characters, a qwen2 config.json."""
    import string

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>").save_pretrained(
        folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": len(vocab)}, f)
    return folder


def test_a_tokenizer_that_drops_every_space_and_newline_is_refused_naming_the_folder(tmp_path):
    folder = _raw_character_folder(str(tmp_path / "raw"))
    loaded = AutoTokenizer.from_pretrained(folder)
    decoded = loaded.decode(loaded.encode("a b\nc d", add_special_tokens=False))
    if " " in decoded or "\n" in decoded:
        pytest.skip(f"this transformers loads the raw-character folder as {type(loaded).__name__}, which keeps them")
    with pytest.raises(ValueError, match=r"raw drops spaces and newlines: 'a b\\nc d' encodes to .* Qwen2Tokenizer"):
        load_tokenizer(folder)


def test_the_char_tokenizer_folder_passes_the_whitespace_check(tmp_path):
    folder = save_random_model(str(tmp_path / "model"), "tiny")
    assert load_tokenizer(folder).decode(load_tokenizer(folder).encode("a b\nc d", add_special_tokens=False)) == "a b\nc d"
