"""The prompt data set and collation: chat templates, truncation, filtering, and every kind of bad input."""

from __future__ import annotations

import json

import pytest
import torch

from npu_rl.data.dataset import PromptDataset
from npu_rl.data.io import write_parquet
from npu_rl.data.loader import PromptCollator
from tests.helpers import make_tiny_tokenizer


def _row(content="What is 1 + 2?", answer="3", index=None, **extra):
    row = {"data_source": "arith", "prompt": [{"role": "user", "content": content}], "ability": "arith",
           "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"split": "train", **extra}}
    if index is not None:
        row["extra_info"]["index"] = index
    return row


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def tok():
    return make_tiny_tokenizer()


def test_chat_template_and_items(tmp_path, tok):
    path = write_parquet([_row(index=7), _row("Hi", "0", index=8)], str(tmp_path / "d.parquet"))
    ds = PromptDataset(path, tok, return_raw_chat=True, return_full_prompt=True)
    assert len(ds) == 2
    item = ds[0]
    text = "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert item["full_prompts"] == text
    assert tok.decode(item["input_ids"]) == text
    assert item["ground_truth"] == "3" and item["data_source"] == "arith" and item["index"] == 7
    assert item["extra_info"] == {"split": "train", "index": 7}
    assert item["raw_prompt"] == [{"role": "user", "content": "What is 1 + 2?"}]


def test_plain_prompt_without_a_template_and_string_prompts(tmp_path):
    tok = make_tiny_tokenizer(chat_template=False)
    rows = [{"question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
             "reward_model": {"ground_truth": "4"}},
            {"question": "3+3?", "ground_truth": "6"}]  # a bare string prompt, a top-level ground truth
    ds = PromptDataset(_jsonl(tmp_path / "d.jsonl", rows), tok, prompt_key="question")
    assert tok.decode(ds[0]["input_ids"]) == "Be brief.\n2+2?"
    assert tok.decode(ds[1]["input_ids"]) == "3+3?" and ds[1]["ground_truth"] == "6"
    assert ds[1]["index"] == 1  # no extra_info.index: the row number in its file


def test_several_files_in_order(tmp_path, tok):
    a = _jsonl(tmp_path / "a.jsonl", [_row("a", "1")])
    b = write_parquet([_row("b", "2"), _row("c", "3")], str(tmp_path / "b.parquet"))
    ds = PromptDataset([a, b], tok)
    assert [ds[i]["ground_truth"] for i in range(3)] == ["1", "2", "3"]


def test_truncation_modes(tmp_path, tok):
    path = _jsonl(tmp_path / "d.jsonl", [_row("x" * 40)])
    full = PromptDataset(path, tok, max_prompt_length=200)[0]["input_ids"]
    n = len(full)  # 40 characters + the template's tokens
    limit = n - 5
    assert (PromptDataset(path, tok, max_prompt_length=limit, truncation="left")[0]["input_ids"] == full[5:]).all()
    assert (PromptDataset(path, tok, max_prompt_length=limit, truncation="right")[0]["input_ids"]
            == full[:limit]).all()
    middle = PromptDataset(path, tok, max_prompt_length=limit, truncation="middle")[0]["input_ids"]
    assert (middle[: limit // 2] == full[: limit // 2]).all() and (middle[limit // 2:] == full[-(limit - limit // 2):]).all()
    with pytest.raises(ValueError, match=rf"{path}: row 0: prompt is {n} tokens, longer than "
                                         rf"data.max_prompt_length={limit}"):
        PromptDataset(path, tok, max_prompt_length=limit, truncation="error")
    with pytest.raises(ValueError, match="data.truncation must be one of"):
        PromptDataset(path, tok, truncation="both")


def test_filter_overlong_prompts_counts_and_logs(tmp_path, tok, caplog):
    path = _jsonl(tmp_path / "d.jsonl", [_row("short", "1"), _row("y" * 100, "2"), _row("ok", "3")])
    with caplog.at_level("INFO", logger="npu_rl.data.dataset"):
        ds = PromptDataset(path, tok, max_prompt_length=50, filter_overlong_prompts=True)
    assert len(ds) == 2 and ds.num_filtered == 1
    assert [ds[i]["ground_truth"] for i in range(2)] == ["1", "3"]
    assert "dropped 1 of 3 prompts longer than max_prompt_length=50" in caplog.text
    with pytest.raises(ValueError, match="no prompts left"):
        PromptDataset(path, tok, max_prompt_length=5, filter_overlong_prompts=True)


@pytest.mark.parametrize("row, message", [
    ({"data_source": "arith", "reward_model": {"ground_truth": "1"}}, r"row 1 has no prompt key 'prompt'"),
    (_row(""), r"row 1: 'prompt' is empty"),
    ({**_row(), "prompt": []}, r"row 1: 'prompt' is empty"),
    ({**_row(), "prompt": [{"content": "hi"}]}, r"row 1: prompt\[0\] must be a dict with 'role' and 'content'"),
    ({**_row(), "prompt": 5}, r"row 1: 'prompt' is a int"),
    ({**_row(), "reward_model": {"style": "rule"}}, r"row 1 has no ground truth"),
    ({**_row(), "reward_model": {"style": "rule", "ground_truth": "  "}}, r"row 1 has no ground truth"),
])
def test_bad_rows_name_file_and_row(tmp_path, tok, row, message):
    path = _jsonl(tmp_path / "bad.jsonl", [_row(), row])
    with pytest.raises(ValueError, match=message) as info:
        PromptDataset(path, tok)
    assert path in str(info.value)


def test_ground_truth_not_required_when_told(tmp_path, tok):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "hello"}])
    assert PromptDataset(path, tok, require_ground_truth=False)[0]["ground_truth"] is None


def test_bad_files(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        PromptDataset(str(tmp_path / "missing.parquet"), tok)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps(_row()).encode() + b"\n" + '{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{latin1}: not UTF-8 text \(line 2"):
        PromptDataset(str(latin1), tok)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(_row()) + "\n{not json\n")
    with pytest.raises(ValueError, match=rf"{broken}: line 2 is not valid JSON"):
        PromptDataset(str(broken), tok)
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("hello")
    with pytest.raises(ValueError, match=rf"{not_parquet}: cannot read as parquet"):
        PromptDataset(str(not_parquet), tok)
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown format"):
        PromptDataset(str(csv), tok)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no rows"):
        PromptDataset(str(empty), tok)


def test_collate_left_pads_with_masks_and_positions(tmp_path, tok):
    path = _jsonl(tmp_path / "d.jsonl", [_row("ab", "1", index=0), _row("abcd", "2", index=1)])
    ds = PromptDataset(path, tok, return_raw_chat=True)
    batch = PromptCollator(tok.pad_token_id)([ds[0], ds[1]])
    short, long = len(ds[0]["input_ids"]), len(ds[1]["input_ids"])
    assert long == short + 2
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    assert ids.shape == mask.shape == pos.shape == (2, long) and ids.dtype == torch.long
    # row 0 is two tokens shorter: two pad tokens on the left, masked out, positions 0 there and 0.. after
    assert ids[0, :2].tolist() == [tok.pad_token_id] * 2 and ids[0, 2:].tolist() == ds[0]["input_ids"].tolist()
    assert mask[0].tolist() == [0, 0] + [1] * short and mask[1].tolist() == [1] * long
    assert pos[0].tolist() == [0, 0] + list(range(short)) and pos[1].tolist() == list(range(long))
    assert batch["raw_prompt_ids"][0] == ds[0]["input_ids"].tolist()
    assert list(batch["ground_truth"]) == ["1", "2"] and list(batch["index"]) == [0, 1]
    assert batch["raw_prompt"][1] == [{"role": "user", "content": "abcd"}]  # a list of dicts, kept whole
    assert len(set(batch["uid"])) == 2
    assert batch.meta == {}
