"""The tests' character tokenizer survives the trip through a model folder: transformers (5.17, and 5.19 where the
config says ``model_type: qwen2``) loads such a folder as ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from the
vocabulary. Spelled in raw characters, every space and newline was lost there, and verl's Qwen chat builder refused
the tokenizer ("\\n" encoded to no token)."""

from __future__ import annotations

from transformers import AutoTokenizer

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
