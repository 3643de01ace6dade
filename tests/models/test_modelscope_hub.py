"""ModelScope model ids (npu_rl.models.modelscope_hub) against a fake ModelScope server on 127.0.0.1 and a
pre-filled cache; nothing reaches the internet."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time

import pytest

from npu_rl.config.loader import load_config
from npu_rl.models import modelscope_hub
from npu_rl.models.loader import check_model_path, load_tokenizer, local_model_folder, resolve_model_path
from npu_rl.models.modelscope_hub import ModelScopeId, parse_modelscope_id
from npu_rl.plan.model_shape import model_shape
from npu_rl.trainer.checks.files import file_problems
from tests.fake_hub import SilentHub, folder_files
from tests.fake_modelscope import FakeModelScope

needs_modelscope = pytest.mark.skipif(importlib.util.find_spec("modelscope") is None,
                                      reason="pip install modelscope (npu-rl[test] has it)")
REPO = "tiny-org/tiny-qwen"
SMALL = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
         "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "algorithm.adv_estimator=grpo",
         "data.train_files=builtin://arith/train?num_train=8&num_test=4&seed=5",
         "data.val_files=builtin://arith/test?num_train=8&num_test=4&seed=5"]


@pytest.fixture()
def fake_ms(tiny_model_dir):
    server = FakeModelScope().start()
    files = folder_files(tiny_model_dir)
    files["onnx/model.onnx"] = b"not wanted"  # a format a run never needs: not downloaded
    server.add(REPO, files, revisions=("v1.0",))
    yield server
    server.stop()


def ms_env(monkeypatch, tmp_path, endpoint: str | None = None, offline: bool = False) -> str:
    """modelscope pointed at ``endpoint`` with a fresh cache (returned) under ``tmp_path``."""
    for key in ("MODELSCOPE_DOMAIN", "MODELSCOPE_ENDPOINT", "VERL_USE_MODELSCOPE", "MODELSCOPE_API_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)
    cache = str(tmp_path / "ms")
    monkeypatch.setenv("MODELSCOPE_CACHE", cache)
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))  # modelscope's credentials folder
    if endpoint:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1" if offline else "0")
    return cache


def prefill(cache: str, repo_id: str, files: dict[str, bytes], revision: str = "master") -> str:
    """The layout modelscope >= 1.38 writes: models/<owner>--<name>/snapshots/<revision>/..."""
    snapshot = os.path.join(cache, "models", repo_id.replace("/", "--"), "snapshots", revision)
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(snapshot, name)), exist_ok=True)
        with open(os.path.join(snapshot, name), "wb") as f:
            f.write(data)
    return snapshot


def test_ids_explicit_and_under_verls_switch(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_USE_MODELSCOPE", raising=False)
    assert parse_modelscope_id("modelscope://Qwen/Qwen2.5-0.5B") == ModelScopeId("Qwen/Qwen2.5-0.5B")
    assert parse_modelscope_id("modelscope://Qwen/Qwen2.5-0.5B@v1.0") == ModelScopeId("Qwen/Qwen2.5-0.5B", "v1.0")
    assert str(ModelScopeId("Qwen/Qwen2.5-0.5B", "v1.0")) == "modelscope://Qwen/Qwen2.5-0.5B@v1.0"
    assert parse_modelscope_id("Qwen/Qwen2.5-0.5B") is None  # a Hub id without the switch
    for bad in ("modelscope://gpt2", "modelscope://a/b/c", "modelscope://../x"):
        with pytest.raises(ValueError, match="not a ModelScope model id"):
            parse_modelscope_id(bad)
    monkeypatch.setenv("VERL_USE_MODELSCOPE", "True")
    assert parse_modelscope_id("Qwen/Qwen2.5-0.5B@v1.0") == ModelScopeId("Qwen/Qwen2.5-0.5B", "v1.0")
    assert parse_modelscope_id("gpt2") is None  # no owner: not a ModelScope id
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse_modelscope_id("org/model") is None  # a local folder wins over the switch
    monkeypatch.setenv("VERL_USE_MODELSCOPE", "False")
    assert parse_modelscope_id("Qwen/Qwen2.5-0.5B") is None


@needs_modelscope
def test_validation_asks_the_server_then_the_run_downloads_once(fake_ms, tmp_path, monkeypatch):
    cache = ms_env(monkeypatch, tmp_path, fake_ms.endpoint)
    path = f"modelscope://{REPO}"
    assert file_problems(load_config(SMALL + [f"actor_rollout_ref.model.path={path}"]), use_critic=False) == []
    assert fake_ms.requests and not any("FilePath=" in r for r in fake_ms.requests)  # asked, nothing downloaded
    folders = []
    threads = [threading.Thread(target=lambda: folders.append(resolve_model_path(path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(folders) == 3 and set(folders) == {os.path.join(cache, "models", "tiny-org--tiny-qwen", "snapshots",
                                                               "master")}
    folder = folders[0]
    weights = [r for r in fake_ms.requests if "FilePath=model.safetensors" in r]
    assert len(weights) == 1  # three ranks, one download
    # and the later two waited on the lock, then found the snapshot: the file list was asked for by validation, the
    # one download's check and modelscope's snapshot_download, never by them
    assert len([r for r in fake_ms.requests if "/repo/files" in r]) == 3
    assert not os.path.exists(os.path.join(folder, "onnx"))
    assert load_tokenizer(path).pad_token_id is not None
    fake_ms.stop()  # every later caller reads the cache
    assert check_model_path(path) == folder == local_model_folder(path)
    assert model_shape(path).num_layers > 0  # npu-rl plan reads config.json from the cached snapshot


@needs_modelscope
def test_verl_switch_sends_a_plain_id_to_modelscope(fake_ms, tmp_path, monkeypatch):
    cache = ms_env(monkeypatch, tmp_path, fake_ms.endpoint)
    monkeypatch.setenv("VERL_USE_MODELSCOPE", "True")
    config = load_config(SMALL + [f"actor_rollout_ref.model.path={REPO}", f"critic.model.path={REPO}"])
    assert file_problems(config, use_critic=True) == []
    assert any(f"/api/v1/models/{REPO}/repo/files" in r for r in fake_ms.requests)
    folder = resolve_model_path(f"{REPO}@v1.0")
    assert folder == os.path.join(cache, "models", "tiny-org--tiny-qwen", "snapshots", "v1.0")
    problems = file_problems(load_config(SMALL + ["actor_rollout_ref.model.path=tiny-org/no-such-model"]), False)
    assert len(problems) == 1
    assert "modelscope://tiny-org/no-such-model" in problems[0] and fake_ms.endpoint in problems[0]
    with pytest.raises(FileNotFoundError, match="no revision 'v9' of tiny-org/tiny-qwen"):
        check_model_path(f"{REPO}@v9")


@needs_modelscope
def test_offline_reads_the_cache_and_names_it_when_missing(tiny_model_dir, tmp_path, monkeypatch):
    cache = ms_env(monkeypatch, tmp_path, "http://127.0.0.1:9", offline=True)  # nothing may be asked
    snapshot = prefill(cache, REPO, folder_files(tiny_model_dir))
    assert check_model_path(f"modelscope://{REPO}") == snapshot
    assert resolve_model_path(f"modelscope://{REPO}") == snapshot
    with pytest.raises(FileNotFoundError) as exc:
        check_model_path("modelscope://Qwen/Qwen2.5-7B-Instruct")
    message = str(exc.value)
    assert "modelscope://Qwen/Qwen2.5-7B-Instruct" in message and cache in message and "HF_HUB_OFFLINE" in message
    with pytest.raises(FileNotFoundError, match="modelscope://Qwen/Qwen2.5-7B-Instruct is not in the ModelScope"):
        resolve_model_path("modelscope://Qwen/Qwen2.5-7B-Instruct")
    config = load_config(SMALL + [f"actor_rollout_ref.model.path=modelscope://{REPO}", "reward_model.enable=True",
                                  "reward_model.model.path=modelscope://org/rm-not-cached"])
    assert [p for p in file_problems(config, use_critic=False) if p.startswith("reward_model.model.path: ")] == [
        f"reward_model.model.path: modelscope://org/rm-not-cached is not in the ModelScope cache ({cache}), and "
        "HF_HUB_OFFLINE is set. Download it once online (`modelscope download --model org/rm-not-cached`, or unset "
        "HF_HUB_OFFLINE), point MODELSCOPE_CACHE at the cache that has it, or give a local folder"]
    # the layout of modelscope < 1.38 (hub/models/<owner>/<name with . as ___>), as an older download left it
    legacy = os.path.join(cache, "hub", "models", "org", "Legacy___Model")
    os.makedirs(legacy)
    for name, data in folder_files(tiny_model_dir).items():
        with open(os.path.join(legacy, name), "wb") as f:
            f.write(data)
    assert check_model_path("modelscope://org/Legacy.Model") == legacy
    v1 = prefill(cache, "org/tagged", folder_files(tiny_model_dir), revision="v1.0")
    assert check_model_path("modelscope://org/tagged@v1.0") == v1
    with pytest.raises(FileNotFoundError, match="org/tagged is not in"):  # no revision: master, not any snapshot
        check_model_path("modelscope://org/tagged")
    prefill(cache, "org/config-only", {"config.json": b"{}"})
    with pytest.raises(FileNotFoundError, match="org/config-only"):  # no weights: not a usable snapshot
        check_model_path("modelscope://org/config-only")
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "elsewhere")):
        check_model_path(f"modelscope://{REPO}")


@needs_modelscope
def test_a_server_that_hangs_times_out_naming_the_id_and_endpoint(tmp_path, monkeypatch):
    silent = SilentHub().start()
    port = silent.port
    try:
        endpoint = f"http://user:s3cret@127.0.0.1:{port}"
        ms_env(monkeypatch, tmp_path, endpoint)
        monkeypatch.setenv("MODELSCOPE_API_TIMEOUT", "1")
        start = time.monotonic()
        with pytest.raises(FileNotFoundError) as exc:
            check_model_path(f"modelscope://{REPO}")
        assert time.monotonic() - start < 10
    finally:
        silent.stop()
    message = str(exc.value)
    assert f"modelscope://{REPO}: http://<redacted>@127.0.0.1:{port} did not answer within 1 s" in message
    assert "s3cret" not in message
    monkeypatch.setenv("MODELSCOPE_API_TIMEOUT", "0")
    with pytest.raises(ValueError, match="MODELSCOPE_API_TIMEOUT='0' is not a positive number of seconds"):
        check_model_path(f"modelscope://{REPO}")


@needs_modelscope
def test_an_unreachable_server_says_so(tmp_path, monkeypatch):
    server = FakeModelScope().start()
    endpoint = server.endpoint
    server.stop()  # nothing listens there now
    ms_env(monkeypatch, tmp_path, endpoint)
    with pytest.raises(FileNotFoundError, match=f"{REPO}: {endpoint} cannot be reached .* HF_HUB_OFFLINE=1"):
        check_model_path(f"modelscope://{REPO}")


def test_without_the_package_an_id_fails_naming_it(tmp_path, monkeypatch):
    ms_env(monkeypatch, tmp_path, offline=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "modelscope" else real(name, *a))
    with pytest.raises(ImportError, match=f"modelscope://{REPO} .* pip install modelscope"):
        check_model_path(f"modelscope://{REPO}")
    monkeypatch.setenv("VERL_USE_MODELSCOPE", "true")
    problems = file_problems(load_config(SMALL + [f"actor_rollout_ref.model.path={REPO}"]), use_critic=False)
    assert any("pip install modelscope" in p and "VERL_USE_MODELSCOPE" in p for p in problems), problems
    assert modelscope_hub.cached_model(ModelScopeId(REPO)) is None


@needs_modelscope
def test_eval_takes_a_modelscope_id_from_the_cache(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from npu_rl.commands.evaluate import main as eval_main

    cache = ms_env(monkeypatch, tmp_path, offline=True)
    prefill(cache, REPO, folder_files(tiny_model_dir))
    out = tmp_path / "results.json"
    assert eval_main([f"modelscope://{REPO}", "--task", "arith", "--limit", "2", "--engine", "hf",
                      "--max-new-tokens", "4", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["num_problems"] == 2
    capsys.readouterr()
    assert eval_main(["modelscope://tiny-org/not-cached", "--task", "arith", "--limit", "1", "--engine", "hf"]) == 2
    err = capsys.readouterr().err
    assert "modelscope://tiny-org/not-cached is not in the ModelScope cache" in err and cache in err, err


@needs_modelscope
def test_plan_reads_a_cached_modelscope_snapshot(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from npu_rl.commands.plan import main as plan_main

    cache = ms_env(monkeypatch, tmp_path, offline=True)
    prefill(cache, REPO, folder_files(tiny_model_dir))
    monkeypatch.setenv("VERL_USE_MODELSCOPE", "True")
    assert plan_main(["--device", "atlas-a3", f"actor_rollout_ref.model.path={REPO}"] + SMALL[:5]) == 0
    capsys.readouterr()
    assert plan_main(["--device", "atlas-a3", "actor_rollout_ref.model.path=tiny-org/not-cached"] + SMALL[:5]) == 2
    assert "tiny-org/not-cached' is not a folder or a cached model on this machine" in capsys.readouterr().err


@needs_modelscope
def test_a_corrupt_modelscope_download_is_named_file_by_file(tiny_model_dir, tmp_path, monkeypatch):
    """issue 39: the same for ModelScope: a tokenizer.json cut short is named with the endpoint, not a raw
    traceback from transformers."""
    from npu_rl.utils.safe_load import CorruptFileError

    files = folder_files(tiny_model_dir)
    files["tokenizer.json"] = files["tokenizer.json"][: len(files["tokenizer.json"]) // 2]
    server = FakeModelScope().start()
    try:
        server.add(REPO, files)
        ms_env(monkeypatch, tmp_path, server.endpoint)
        with pytest.raises(CorruptFileError, match=rf"modelscope://{REPO}: the snapshot downloaded from "
                                                   rf"{server.endpoint} is not whole: \S+/tokenizer.json is not "
                                                   r"valid JSON \(JSONDecodeError"):
            resolve_model_path(f"modelscope://{REPO}")
    finally:
        server.stop()
