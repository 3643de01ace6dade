"""`npu-rl bench trl --sides ours` end to end on a tiny model: our side runs through the real CLI in its own process
with the bench's recipe, validates on the held-out rows before and after, and writes nothing at the end but its
metrics (no checkpoint, no curves)."""

from __future__ import annotations

import json
import os
import tempfile

from npu_rl.commands import bench_trl


def test_our_side_runs_the_recipe_and_writes_no_checkpoint(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the bench's work folder, kept for the checks below
    out = tmp_path / "bench.json"
    argv = ["--model", tiny_model_dir, "--sides", "ours", "--prompts", "2", "--n", "2", "--response-length", "8",
            "--steps", "2", "--engine", "hf", "--precision", "fp32", "--micro-batch", "2", "--repeat", "2", "--keep",
            "--out", str(out)]
    assert bench_trl.main(argv) == 0
    report = json.loads(out.read_text())
    assert [(r["run"], r["cache"], r["side"], r["num_steps"]) for r in report["runs"]] == [
        (1, "cold", "ours", 2), (2, "warm", "ours", 2)]
    for r in report["runs"]:
        assert r["heldout_before"] is not None and r["heldout_after"] is not None and r["val_s"] > 0
        assert 0 < r["startup_s"] < r["wall_s"]
    work = next(p for p in tmp_path.iterdir() if p.name.startswith("npu-rl-bench-trl-"))
    run_dir = work / "ours-1" / "run"
    written = {os.path.relpath(os.path.join(d, n), run_dir) for d, _, names in os.walk(run_dir) for n in names}
    assert not any(w.startswith("global_step") or "curves" in w for w in written), written
    assert any(w.endswith("metrics.jsonl") for w in written)
    assert "| 2 (warm) | ours |" in capsys.readouterr().out
