"""``npu-rl bench moe`` on a CPU: the rows, the FLOP count, refusals, and ``--profile``'s kernel table."""

from __future__ import annotations

import json

import pytest
import torch

from npu_rl.commands.bench_moe import build_block, main


def test_flop_count_of_a_qwen3_block_is_the_issue_formula():
    _, numbers = build_block("tiny", "eager", torch.float32, torch.device("cpu"))
    # 3 x 2 x (top_k x 3 x hidden x moe_intermediate + hidden x experts)
    assert numbers["flops_per_token"] == 6 * (2 * 3 * 64 * 32 + 64 * 8)


def test_rows_and_profile_on_cpu(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert main(["--shape", "tiny", "--tokens", "32", "--implementations", "eager,grouped_mm", "--iters", "1",
                 "--warmup", "0", "--dtype", "fp32", "--profile", "3", "--json", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["implementation"] for r in rows] == ["eager", "grouped_mm"]
    for row in rows:
        assert row["ms"] > 0 and row["tokens"] == 32
        profile = row["profile"]
        assert 0 < profile["matmul_ms"] <= profile["total_ms"] and len(profile["top"]) == 3
        # the share is rounded from the unrounded times: from the printed (rounded) ones it is within one last digit
        assert profile["matmul_share"] == pytest.approx(profile["matmul_ms"] / profile["total_ms"], abs=1e-3)
    text = capsys.readouterr().out
    assert "profile of tiny eager 32 tokens" in text and "in matrix multiplies" in text


def test_unknown_names_and_bad_counts_are_refused(capsys):
    assert main(["--shape", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().out
    assert main(["--shape", "tiny", "--profile", "-1"]) == 2
