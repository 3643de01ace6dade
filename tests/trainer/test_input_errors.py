"""Bad input that ``python -m npu_rl.trainer.main_ppo`` meets (issue 39): a parquet file that is truncated or not
parquet is refused at validation, naming key and file; one whose footer reads but whose column does not (found by the
data loader, after validation) ends in one line naming the file, column and rows, exit code 2, no traceback; so does a
Hub model whose download is corrupt (validation only asks whether the repo exists)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from npu_rl.trainer.main_ppo import main
from tests.data.test_io import damaged_column
from tests.trainer.conftest import base_overrides


def overrides(model_dir: str, tmp_path, reward_file: str, train: str) -> list[str]:
    return [o for o in base_overrides(model_dir, str(tmp_path / "out"), reward_file)
            if not o.startswith("data.train_files=")] + [f"data.train_files={train}", "preset=grpo"]


def verl_rows(path: str, rows: int = 8) -> str:
    pq.write_table(pa.Table.from_pylist([{"data_source": "arith", "prompt": [{"role": "user", "content": "1+1="}],
                                          "reward_model": {"style": "rule", "ground_truth": "2"}}] * rows), path)
    return path


def test_a_truncated_parquet_is_refused_at_validation(tiny_model_dir, tmp_path, reward_file, capsys):
    good = verl_rows(str(tmp_path / "good.parquet"))
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(open(good, "rb").read()[:-30])
    assert main(overrides(tiny_model_dir, tmp_path, reward_file, str(cut))) == 2
    err = capsys.readouterr().err
    assert f"data.train_files: {cut}: cannot read as parquet: ArrowInvalid" in err and "Traceback" not in err


def test_a_damaged_column_after_validation_is_one_line_naming_file_and_column(tiny_model_dir, tmp_path,
                                                                              reward_file, capsys):
    bad = damaged_column(str(tmp_path / "train.parquet"), "prompt")
    assert main(overrides(tiny_model_dir, tmp_path, reward_file, bad)) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("npu-rl: error: "))
    assert f"{bad}: cannot read as parquet: column 'prompt' (row group 0, rows 0-99): OSError" in line
    assert "Traceback" not in err


def test_a_corrupt_hub_download_is_one_line_naming_the_files(tiny_model_dir, tmp_path, reward_file, capsys,
                                                              monkeypatch):
    from tests.fake_hub import FakeHub, folder_files, online_env

    files = folder_files(tiny_model_dir)
    files["generation_config.json"] = b'{"eos_token_id": '
    server = FakeHub().start()
    try:
        server.add("models", "tiny-org/tiny-qwen", files)
        online_env(monkeypatch, server, str(tmp_path / "hf"))
        argv = [o for o in overrides(tiny_model_dir, tmp_path, reward_file, verl_rows(str(tmp_path / "t.parquet")))
                if not o.startswith("actor_rollout_ref.model.path=")] + ["actor_rollout_ref.model.path=tiny-org/tiny-qwen"]
        assert main(argv) == 2
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert f"npu-rl: tiny-org/tiny-qwen: the snapshot downloaded from {server.endpoint} is not whole: " in err
    assert "generation_config.json is not valid JSON" in err and "Traceback" not in err
