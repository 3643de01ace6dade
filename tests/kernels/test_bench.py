"""``npu-rl bench kernels`` runs end to end on a tiny shape and reports every method it was asked for."""

from __future__ import annotations

import json

from npu_rl.commands import bench_kernels as bench


def test_bench_tiny_table(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    argv = ["--shapes", "tiny", "--tokens", "33", "--methods", "naive,torch", "--iters", "1", "--warmup", "0",
            "--json", str(out)]
    assert bench.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["method"] for r in rows] == ["naive", "torch"]
    assert all("error" not in r and r["fwd_bwd_ms"] > 0 and r["fwd_ms"] > 0 for r in rows)
    table = capsys.readouterr().out
    assert "| tiny | 33 | torch |" in table


def test_bench_reports_a_missing_package_instead_of_failing(monkeypatch):
    def missing(*_):
        raise ImportError("no", name="liger_kernel")

    monkeypatch.setattr(bench, "_methods", missing)
    from npu_rl.device import get_backend

    args = bench._parser().parse_args(["--iters", "1"])
    row = bench.run_one("tiny", 8, "liger", args, get_backend())
    assert row["error"] == "not installed (liger_kernel)"
    assert bench.main(["--methods", "nope"]) == 2
