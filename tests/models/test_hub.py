"""Hub model ids (npu_rl.models.hub) against a fake Hub on 127.0.0.1 and a pre-filled cache; nothing reaches the
internet."""

from __future__ import annotations

import os
import threading

import pytest

from npu_rl.models import hub
from npu_rl.models.loader import check_model_path, load_tokenizer, resolve_model_path
from tests.fake_hub import FakeHub, folder_files, offline_env, online_env

REPO = "tiny-org/tiny-qwen"


@pytest.fixture()
def fake_hub(tiny_model_dir):
    server = FakeHub().start()
    files = folder_files(tiny_model_dir)
    files["onnx/model.onnx"] = b"not wanted"  # a format a run never needs: not downloaded
    server.add("models", REPO, files)
    yield server
    server.stop()


def test_hub_ids_and_schemes():
    assert hub.parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct") == hub.HubId("Qwen/Qwen2.5-0.5B-Instruct")
    assert hub.parse_hub_id("gpt2") == hub.HubId("gpt2")
    assert hub.parse_hub_id("Qwen/Qwen2-7B@v1.0") == hub.HubId("Qwen/Qwen2-7B", "v1.0")
    for not_an_id in ("~/models/qwen", "./qwen", "/abs/path", "a/b/c", "../x", "a//b", "models--a--b"):
        assert hub.parse_hub_id(not_an_id) is None, not_an_id
    assert "hdfs dfs -get" in hub.refused_scheme("hdfs://nn/user/models/qwen")
    assert "s3://" in hub.refused_scheme("s3://bucket/qwen")
    assert hub.refused_scheme("Qwen/Qwen2-7B") is None


def test_hdfs_model_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="hdfs:// paths .* copy the model to a local folder"):
        resolve_model_path("hdfs://namenode/models/Qwen2-7B")
    with pytest.raises(ValueError, match="hdfs://"):
        check_model_path("hdfs://namenode/models/Qwen2-7B")


def test_validation_asks_the_hub_then_the_run_downloads_once(fake_hub, tmp_path, monkeypatch):
    online_env(monkeypatch, fake_hub, str(tmp_path / "hf"))
    assert check_model_path(REPO) is None  # exists on the Hub, not downloaded at validation
    assert not any("/resolve/" in r for r in fake_hub.requests)
    folder = resolve_model_path(REPO)
    sha = fake_hub.sha("models", REPO)
    assert folder == str(tmp_path / "hf" / "hub" / "models--tiny-org--tiny-qwen" / "snapshots" / sha)
    assert sorted(os.listdir(folder)) == sorted(f for f in folder_files(folder) if "/" not in f)
    assert not os.path.exists(os.path.join(folder, "onnx"))
    assert load_tokenizer(REPO).pad_token_id is not None
    # every later caller (ranks, the rollout engine) gets the same folder from the cache, with the Hub gone
    fake_hub.stop()
    assert resolve_model_path(REPO) == folder
    assert check_model_path(REPO) == folder


def test_concurrent_ranks_download_once(fake_hub, tmp_path, monkeypatch):
    online_env(monkeypatch, fake_hub, str(tmp_path / "hf"))
    folders = []
    threads = [threading.Thread(target=lambda: folders.append(resolve_model_path(REPO))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(folders)) == 1 and len(folders) == 3
    weights_gets = [r for r in fake_hub.requests if r.startswith("GET") and r.endswith("/model.safetensors")]
    assert len(weights_gets) == 1


def test_revision_pins_the_snapshot(fake_hub, tmp_path, monkeypatch):
    online_env(monkeypatch, fake_hub, str(tmp_path / "hf"))
    sha = fake_hub.sha("models", REPO)
    folder = resolve_model_path(f"{REPO}@{sha}")
    assert os.path.basename(folder) == sha
    with pytest.raises(FileNotFoundError, match="tiny-org/no-such-model: not a local folder, and no such model repo on "
                                                f"{fake_hub.endpoint}"):
        check_model_path("tiny-org/no-such-model")


def test_unreachable_hub_says_so(tmp_path, monkeypatch):
    server = FakeHub().start()
    online_env(monkeypatch, server, str(tmp_path / "hf"))
    server.stop()  # nothing listens there now
    with pytest.raises(FileNotFoundError, match="cannot be reached .* HF_HUB_OFFLINE=1"):
        check_model_path(REPO)


def test_offline_uses_the_cache_and_names_it_when_missing(fake_hub, tmp_path, monkeypatch):
    home = str(tmp_path / "hf")
    online_env(monkeypatch, fake_hub, home)
    folder = resolve_model_path(REPO)  # fills the cache, as an earlier online run would have
    fake_hub.stop()
    offline_env(monkeypatch, home)
    assert check_model_path(REPO) == folder
    assert resolve_model_path(REPO) == folder
    cache = os.path.join(home, "hub")
    with pytest.raises(FileNotFoundError) as exc:
        check_model_path("Qwen/Qwen2-7B-Instruct")
    assert "Qwen/Qwen2-7B-Instruct" in str(exc.value) and cache in str(exc.value) and "HF_HUB_OFFLINE" in str(exc.value)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "elsewhere")):
        check_model_path(REPO)


def _prefill_cache(hub_root: str, repo_id: str, files: dict[str, bytes], sha: str = "a" * 40) -> str:
    """The layout huggingface_hub writes (refs/main -> snapshots/<sha>/...), as an earlier `hf download` left it."""
    storage = os.path.join(hub_root, "models--" + repo_id.replace("/", "--"))
    os.makedirs(os.path.join(storage, "refs"))
    with open(os.path.join(storage, "refs", "main"), "w") as f:
        f.write(sha)
    snapshot = os.path.join(storage, "snapshots", sha)
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(snapshot, name)), exist_ok=True)
        with open(os.path.join(snapshot, name), "wb") as f:
            f.write(data)
    return snapshot


def test_the_examples_default_model_resolves_where_it_is_cached(tiny_model_dir, tmp_path, monkeypatch):
    import re

    from tests.conftest import REPO_ROOT

    with open(os.path.join(REPO_ROOT, "examples", "common.sh")) as f:
        default = re.search(r'model\.path="\$\{MODEL_PATH:-([^}]+/[^}]+)\}"', f.read()).group(1)
    home = str(tmp_path / "hf")
    snapshot = _prefill_cache(os.path.join(home, "hub"), default, folder_files(tiny_model_dir))
    offline_env(monkeypatch, home)
    assert check_model_path(default) == snapshot
    assert resolve_model_path(default) == snapshot
    partial = _prefill_cache(os.path.join(home, "hub"), "org/config-only", {"config.json": b"{}"})
    assert hub.cached_model(hub.HubId("org/config-only")) is None  # no weights there: not a usable snapshot
    assert os.path.isdir(partial)


def test_a_corrupt_download_is_named_file_by_file(tiny_model_dir, tmp_path, monkeypatch):
    """issue 39: a mirror that serves a truncated safetensors and a tokenizer_config.json cut short passed
    validation (the repo exists) and then failed inside transformers with a raw JSONDecodeError."""
    from npu_rl.models.check import model_path_problems
    from npu_rl.models.loader import local_model_folder
    from npu_rl.utils.safe_load import CorruptFileError

    files = folder_files(tiny_model_dir)
    files["model.safetensors"] = files["model.safetensors"][:-100]
    files["tokenizer_config.json"] = files["tokenizer_config.json"][:-10]
    server = FakeHub().start()
    try:
        server.add("models", REPO, files)
        online_env(monkeypatch, server, str(tmp_path / "hf"))
        assert check_model_path(REPO) is None  # validation: the repo exists; nothing downloaded yet
        with pytest.raises(CorruptFileError) as info:
            load_tokenizer(REPO)  # the run's first use downloads it
    finally:
        server.stop()
    message = str(info.value)
    assert message.startswith(f"{REPO}: the snapshot downloaded from {server.endpoint} is not whole: ")
    assert "tokenizer_config.json is not valid JSON (JSONDecodeError" in message
    assert "model.safetensors is truncated" in message and "hf cache delete" in message
    # the next run's validation reads the cached snapshot and names the same files before anything loads
    problems = model_path_problems(local_model_folder(REPO))
    assert any("tokenizer_config.json is not valid JSON" in p for p in problems), problems
    assert any("model.safetensors is truncated" in p for p in problems), problems
