"""npu-rl plot: PNG + self-contained HTML from metrics.jsonl, one run or several overlaid."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("matplotlib", reason="npu-rl plot needs matplotlib")

from npu_rl.cli import main as cli  # noqa: E402
from npu_rl.tracking.plot import PANELS, find_metrics, load_run, plot_runs, summary_rows  # noqa: E402


def _write_run(folder, steps: int, reward_slope: float, partial_tail: bool = False) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "metrics.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"step": 0, "val-core/arith/acc/mean@1": 0.1}) + "\n")
        for s in range(1, steps + 1):
            f.write(json.dumps({
                "step": s, "critic/score/mean": reward_slope * s, "actor/kl_loss": 0.01 * s, "actor/entropy": 2 - 0.1 * s,
                "response_length/mean": 20 + s, "actor/pg_clipfrac": 0.02, "actor/grad_norm": 1.0 / s,
                "perf/throughput": 1000.0, "timing_s/step": 3.0, "timing_s/gen": 1.0, "timing_s/update_actor": 1.5,
                "val-core/arith/acc/mean@1": 0.1 + 0.05 * s if s % 2 == 0 else None}) + "\n")
        if partial_tail:
            f.write('{"step": 99, "critic/sco')  # killed mid-write
    return path


def test_one_run_gives_png_and_self_contained_html(tmp_path):
    run = tmp_path / "run"
    _write_run(run, 6, 0.1, partial_tail=True)
    png, page = plot_runs([str(run)])
    assert png == str(run / "curves.png") and page == str(run / "curves.html")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    text = open(page, encoding="utf-8").read()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "<script" not in text
    assert 'src="http' not in text and "<link" not in text  # nothing fetched from anywhere
    rows = summary_rows([load_run(str(run / "metrics.jsonl"))])
    assert ("critic/score/mean", "0.1 (step 1)", "0.6 (step 6)") == rows[0][1:4]
    assert len(load_run(str(run / "metrics.jsonl")).rows) == 7  # the partial last line is left out


def test_several_runs_overlaid_from_an_output_folder(tmp_path, capsys):
    _write_run(tmp_path / "out" / "logs" / "20260101-000000", 4, 0.1)
    _write_run(tmp_path / "out" / "logs" / "20260102-000000", 5, 0.2)
    other = _write_run(tmp_path / "b", 3, 0.3)
    assert len(find_metrics(str(tmp_path / "out"))) == 2
    assert cli(["plot", str(tmp_path / "out"), other, "--out", str(tmp_path / "cmp"), "--name", "c"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "cmp" / "c.png"), str(tmp_path / "cmp" / "c.html")]
    html = open(printed[1], encoding="utf-8").read()
    assert html.count("<li>") == 3 and "20260102-000000" in html


def test_plot_names_what_is_wrong(tmp_path, capsys):
    assert cli(["plot", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("not json\n[1]\n")
    assert cli(["plot", str(tmp_path)]) == 2
    assert "no metrics rows to plot" in capsys.readouterr().err
    run = _write_run(tmp_path / "run", steps=2, reward_slope=1.0)
    (tmp_path / "a_file").write_text("")
    assert cli(["plot", run, "--out", str(tmp_path / "a_file" / "pictures")]) == 2  # issue 39: a raw traceback
    assert f"--out='{tmp_path / 'a_file' / 'pictures'}': {tmp_path / 'a_file'} is a file" in capsys.readouterr().err


def test_corrupt_lines_are_skipped_and_counted(tmp_path, capsys):
    path = _write_run(tmp_path / "run", 4, 0.1)
    with open(path, "a") as f:
        f.write('not json\n{"no_step": 1}\n' + "[" * 100_000 + "\n" + json.dumps({"step": 5, "actor/entropy": 1.0}) + "\n")
    run = load_run(path)
    assert [r["step"] for r in run.rows] == [0, 1, 2, 3, 4, 5] and run.num_skipped == 3
    assert cli(["plot", str(tmp_path / "run")]) == 0
    assert "skipped 3 line(s) that are not metrics rows (first: line 6:" in capsys.readouterr().err


def test_a_large_metrics_file_is_read_in_one_pass(tmp_path):
    """20,000 steps x 53 metrics: each metric's series comes from one index built in one pass over the rows (the
    scan per panel and key took minutes)."""
    path = tmp_path / "metrics.jsonl"
    keys = [f"extra/metric_{k}" for k in range(50)] + ["critic/score/mean", "actor/entropy", "timing_s/step"]
    with open(path, "w") as f:
        for s in range(1, 20_001):
            f.write(json.dumps({"step": s, **{k: s * 0.001 for k in keys}}) + "\n")
    run = load_run(str(path))
    calls = 0
    items = run.rows[0].items

    class Counting(dict):
        def items(self):
            nonlocal calls
            calls += 1
            return items()

    run.rows[0] = Counting(run.rows[0])
    for _ in range(3):
        assert len(run.series("critic/score/mean")[0]) == 20_000 and "actor/entropy" in run.keys()
    assert calls == 1  # the rows were walked once, whatever was asked afterwards


def test_every_panel_names_metrics_the_trainer_logs():
    """The panels read keys the trainer writes (names from a real metrics.jsonl row, see trainer/metrics.py)."""
    logged = {"critic/score/mean", "actor/kl_loss", "actor/entropy", "response_length/mean", "actor/pg_clipfrac",
              "actor/grad_norm", "perf/throughput"}
    for title, _, keys in PANELS:
        assert keys[0].endswith("/") or keys[0] in logged, title


def _write_rows(path, steps: int) -> None:
    with open(path, "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "critic/score/mean": s * 0.001, "actor/entropy": 1.0}) + "\n")


def test_a_file_larger_than_the_full_read_is_sampled_evenly(tmp_path, monkeypatch, capsys):
    """issue 39: plot of a multi-GB metrics.jsonl ran for ever. Here the bounds are made small (64 KiB read whole,
    100 rows sampled) so that a 700 KB file stands for a large one."""
    import npu_rl.tracking.plot as plot

    monkeypatch.setattr(plot, "FULL_READ_BYTES", 64 << 10)
    monkeypatch.setattr(plot, "SAMPLED_ROWS", 100)
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    _write_rows(path, 10_000)
    read = []
    real_open = open

    def counting_open(*args, **kwargs):
        f = real_open(*args, **kwargs)
        real_read = f.read
        f.read = lambda n=-1: read.append(len(data := real_read(n))) or data  # noqa: E731
        return f

    monkeypatch.setattr("builtins.open", counting_open)
    run = load_run(str(path))
    monkeypatch.setattr("builtins.open", real_open)
    steps = [r["step"] for r in run.rows]
    assert steps[0] == 1 and steps[-1] == 10_000 and steps == sorted(set(steps)) and 95 <= len(steps) <= 101
    assert sum(read) < 101 * (64 << 10) + 101  # a window per sample and a byte before it, not the file twice
    assert "rows sampled evenly over the file" in run.bounded
    assert cli(["plot", str(path.parent)]) == 0
    assert "rows sampled evenly over the file (it is larger than 0 MiB)" in capsys.readouterr().err


def test_a_large_file_that_is_not_json_lines_is_refused_without_reading_it_all(tmp_path, monkeypatch, capsys):
    import npu_rl.tracking.plot as plot

    monkeypatch.setattr(plot, "FULL_READ_BYTES", 64 << 10)
    monkeypatch.setattr(plot, "WINDOW_BYTES", 4 << 10)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(os.urandom(4 << 20).replace(b"\n", b" "))  # 4 MiB, no line ends: a binary file
    assert cli(["plot", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"npu-rl plot: {path}: 4 MiB with no metrics row in the first 64 samples: not a metrics.jsonl" in err


def test_many_rows_are_thinned_for_drawing(tmp_path, monkeypatch):
    import npu_rl.tracking.plot as plot

    monkeypatch.setattr(plot, "MAX_ROWS", 50)
    path = tmp_path / "metrics.jsonl"
    _write_rows(path, 1000)
    run = load_run(str(path))
    steps = [r["step"] for r in run.rows]
    assert len(steps) == 50 and steps[0] == 1 and steps[-1] == 1000 and steps == sorted(steps)
    assert run.bounded == "1000 rows thinned evenly to 50 for drawing"


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_not_read(tmp_path):
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)  # opening it would wait for a writer for ever
    with pytest.raises(ValueError, match="is not a regular file"):
        load_run(str(fifo))
