"""Each tracker, run for real offline into a run folder, then read back from what it wrote.

The trackers come through accelerate's tracker classes; no network is touched (offline / local stores)."""

from __future__ import annotations

import glob
import json
import os

import pytest

from npu_rl.tracking import Tracker
from npu_rl.tracking.backends import check_trackers

CONFIG = {"algorithm": {"adv_estimator": "grpo"}, "trainer": {"logger": ["console"], "total_training_steps": 2}}
STEPS = {1: {"critic/score/mean": 0.25, "val-core/arith/acc/mean@1": 0.5},
         2: {"critic/score/mean": 0.75, "val-core/arith/acc/mean@1": 1.0}}
SAMPLE = {"step": 2, "data_source": "arith", "prompt": "1+2=", "response": "3", "score": 1.0, "ground_truth": "3"}


@pytest.fixture
def offline_env(monkeypatch, tmp_path):
    """No tracker credentials, no user settings: what a fresh machine looks like."""
    for key in list(os.environ):
        if key.startswith(("WANDB_", "SWANLAB_", "MLFLOW_", "CLEARML_", "TRACKIO_", "TENSORBOARD_DIR")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


def _run(name: str, run_dir: str) -> Tracker:
    tracker = Tracker(["console", name], "npu_rl_tests", "exp1", run_dir, CONFIG, console_write=lambda line: None)
    tracker.log(STEPS[1], 1)
    with open(os.path.join(run_dir, "val_generations.jsonl"), "w") as f:
        f.write(json.dumps(SAMPLE) + "\n")
    tracker.log(STEPS[2], 2)
    tracker.close()
    return tracker


def test_tensorboard(offline_env):
    pytest.importorskip("tensorboard", reason="pip install tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = str(offline_env / "run")
    _run("tensorboard", run_dir)
    acc = EventAccumulator(os.path.join(run_dir, "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("critic/score/mean")] == [(1, 0.25), (2, 0.75)]
    tags = acc.Tags()["tensors"]
    assert "val/generations/text_summary" in tags and "config/text_summary" in tags
    text = acc.Tensors("val/generations/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "1+2=" in text and "score 1.0" in text


def test_tensorboard_dir_from_the_environment(offline_env, monkeypatch):
    pytest.importorskip("tensorboard", reason="pip install tensorboard")
    monkeypatch.setenv("TENSORBOARD_DIR", str(offline_env / "tb_elsewhere"))
    _run("tensorboard", str(offline_env / "run"))
    assert glob.glob(str(offline_env / "tb_elsewhere" / "events.out.tfevents.*"))
    assert not os.path.exists(offline_env / "run" / "tensorboard")


def test_wandb_offline_in_the_run_folder(offline_env):
    pytest.importorskip("wandb", reason="pip install wandb")
    from wandb.proto import wandb_internal_pb2

    run_dir = str(offline_env / "run")
    _run("wandb", run_dir)
    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    history, config = [], {}
    records = _wandb_records_when_complete(path, wandb_internal_pb2)
    for record in records:
        if record.WhichOneof("record_type") == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        if record.WhichOneof("record_type") == "run":
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    scores = [(h["_step"], h["critic/score/mean"]) for h in history if "critic/score/mean" in h]
    assert scores == [(1, 0.25), (2, 0.75)]
    table = next(h for h in history if "val/generations/path" in h)
    assert table["val/generations/_type"] == "table-file" and table["val/generations/nrows"] == 1
    with open(os.path.join(os.path.dirname(path), "files", table["val/generations/path"])) as f:
        assert json.load(f)["data"][0][2] == "1+2="
    assert config["algorithm"] == {"adv_estimator": "grpo"}
    assert not os.path.exists("wandb") or os.path.getmtime("wandb") < os.path.getmtime(path)  # nothing in the cwd


def _wandb_records_when_complete(path: str, pb, timeout: float = 30.0) -> list:
    """wandb's service process writes the file; finish() can return a moment before the last records land."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        records = []
        for data in _wandb_records(path):
            record = pb.Record()
            record.ParseFromString(data)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _wandb_records(path: str):
    """The protobuf records of a .wandb file: a 7-byte header (":W&B", magic, version), then LevelDB's log format:
    32 KiB blocks of chunks (crc32 4 bytes, length 2, type 1: full 1, first 2, middle 3, last 4)."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - (pos % block)
        if left < 7:  # block trailer padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending += chunk
        if kind in (1, 4):
            yield pending
            pending = b""


def test_mlflow_sqlite_store_in_the_run_folder(offline_env):
    pytest.importorskip("mlflow", reason="pip install mlflow-skinny sqlalchemy alembic")
    pytest.importorskip("sqlalchemy", reason="pip install sqlalchemy alembic")
    from mlflow.tracking import MlflowClient

    run_dir = str(offline_env / "run")
    _run("mlflow", run_dir)
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("npu_rl_tests").experiment_id])
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "val-core/arith/acc/mean_at_1")] == [0.5, 1.0]
    assert run.data.params["algorithm.adv_estimator"] == "grpo"
    (table,) = glob.glob(os.path.join(run_dir, "mlflow-artifacts", "*", "artifacts", "val_generations", "step_2.json"))
    with open(table) as f:
        assert json.load(f)["data"][0][2] == "1+2="


def test_trackio_local(offline_env, capfd):
    import importlib.util
    import sqlite3
    import sys

    if importlib.util.find_spec("trackio") is None:
        pytest.skip("pip install trackio")
    run_dir = str(offline_env / "run")
    if "trackio" in sys.modules:  # imported by an earlier test: its folder is fixed; point it here for this test
        import trackio.utils

        pytest.skip(f"trackio was imported earlier in this session (it writes to {trackio.utils.TRACKIO_DIR})")
    _run("trackio", run_dir)
    assert capfd.readouterr().out == ""  # its banners go to stderr: stdout is for results
    (db,) = glob.glob(os.path.join(run_dir, "trackio", "*.db"))
    con = sqlite3.connect(db)
    rows = con.execute("SELECT step, metrics FROM metrics ORDER BY step").fetchall()
    scores = [(step, json.loads(m)["critic/score/mean"]) for step, m in rows if "critic/score/mean" in json.loads(m)]
    assert scores == [(1, 0.25), (2, 0.75)]
    assert any("val/generations" in json.loads(m) for _, m in rows)


@pytest.mark.slow  # in the whole suite ClearML's background reporter never signals done, and close() waits on it
def test_clearml_offline_session_in_the_run_folder(offline_env, capfd):
    pytest.importorskip("clearml", reason="pip install clearml")
    run_dir = str(offline_env / "run")
    _run("clearml", run_dir)
    assert capfd.readouterr().out == ""
    (metrics,) = glob.glob(os.path.join(os.environ.get("CLEARML_CACHE_DIR", os.path.join(run_dir, "clearml")),
                                        "offline", "*", "metrics.jsonl"))
    events = [e for line in open(metrics) if line.strip() for e in json.loads(line)]
    scores = sorted((e["iter"], e["value"]) for e in events if e.get("metric") == "critic/score/mean")
    assert scores == [(1, 0.25), (2, 0.75)], events[:3]
    assert any(e.get("type") == "training_stats_scalar" and e.get("metric") == "val-core/arith/acc/mean@1"
               for e in events)
    assert any("1+2=" in json.dumps(e) for e in events), sorted({e.get("type") for e in events})  # the table


def test_swanlab_offline(offline_env):
    pytest.importorskip("swanlab", reason="swanlab is not installed here: it requires protobuf<7 and this "
                                          "environment has protobuf 7 (pip install 'npu-rl[swanlab]' downgrades it)")
    run_dir = str(offline_env / "run")
    _run("swanlab", run_dir)
    assert glob.glob(os.path.join(run_dir, "swanlog", "**", "*"), recursive=True)


def test_problems_are_found_at_validation_not_after_the_models_load(monkeypatch):
    env = {"SWANLAB_MODE": "cloud"}
    problems = check_trackers(["swanlab", "wandb"], env={**env, "WANDB_MODE": "online"}, interactive=False)
    text = "\n".join(problems)
    if "needs the swanlab package" not in text:
        assert "SWANLAB_MODE=cloud needs SWANLAB_API_KEY" in text
        assert check_trackers(["swanlab"], env={}, interactive=False) == []  # offline by default
    monkeypatch.setenv("HOME", "/nonexistent")
    if "needs the wandb package" not in text:
        assert "WANDB_MODE=online needs WANDB_API_KEY" in "\n".join(
            check_trackers(["wandb"], env={"WANDB_MODE": "online"}, interactive=False))
    assert check_trackers(["wandb", "mlflow", "tensorboard"], env={}, interactive=False) == [] or any(
        "needs the" in p for p in check_trackers(["wandb", "mlflow", "tensorboard"], env={}, interactive=False))
    assert check_trackers(["console", "file"], env={}, interactive=False) == []


def test_a_missing_package_is_a_config_error(monkeypatch):
    import importlib.util

    from npu_rl.config.loader import ConfigError
    from npu_rl.trainer.preflight import load_checked

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"trainer.logger='wandb' needs the wandb package: pip install wandb"):
        load_checked(["trainer.logger=[console,wandb]"], "quickstart")
