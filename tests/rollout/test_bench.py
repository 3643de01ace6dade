"""`npu-rl bench rollout`: a tiny hf-only run end to end, and the Rollout section replaced in place."""

from __future__ import annotations

from npu_rl.commands import bench_rollout as bench


def test_bench_runs_and_rewrites_only_its_section(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.torch, "set_num_threads", lambda n: None)  # keep the session's thread setting
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Kernels\n\nkernel numbers\n\n## Rollout\n\nold numbers\n\n## Trainer\n\nkept\n")
    argv = ["--models", "tiny", "--engines", "hf", "--num-prompts", "2", "--n", "2", "--response-length", "4",
            "--repeats", "1", "--write", str(doc)]
    assert bench.main(argv) == 0
    text = doc.read_text()
    assert "old numbers" not in text and "kernel numbers" in text and text.rstrip().endswith("kept")
    assert text.index("## Kernels") < text.index("## Rollout") < text.index("## Trainer")
    assert "| tiny | 4 |" in text and "npu-rl bench rollout --models tiny" in text


def test_section_is_appended_to_a_file_without_one(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Kernels\n\nx\n")
    bench.write_section(str(doc), "## Rollout\n\ny\n")
    assert doc.read_text() == "# Benchmarks\n\n## Kernels\n\nx\n\n## Rollout\n\ny\n"
    fresh = tmp_path / "new.md"
    bench.write_section(str(fresh), "## Rollout\n\ny\n")
    assert fresh.read_text().startswith("# Benchmarks\n\n## Rollout")


def test_bench_takes_a_random_weight_shape_and_the_hf_variants(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench.torch, "set_num_threads", lambda n: None)
    argv = ["--models", "shape:tiny", "--engines", "hf_eager,hf", "--num-prompts", "2", "--n", "1",
            "--prompt-length", "5", "--response-length", "3", "--repeats", "1"]
    assert bench.main(argv) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| shape:tiny"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2" and cells[2] != "-" and cells[3] != "-" and cells[4] == "-"  # hf, hf eager; no compiled


def test_compiled_hf_and_vllm_are_refused_in_one_process(monkeypatch, capsys):
    from npu_rl.device import backend as backend_module

    monkeypatch.setattr(backend_module, "_BACKEND", backend_module.make_backend("cpu"))
    assert bench.compiled_with_vllm(["hf_eager", "vllm"]) is None and bench.compiled_with_vllm(["hf"]) is None
    assert bench.main(["--engines", "hf_compiled,vllm"]) == 2
    assert "cannot share a process" in capsys.readouterr().err
    monkeypatch.setattr(backend_module, "_BACKEND", backend_module.make_backend("cuda"))
    assert bench.compiled_with_vllm(["hf", "vllm"])  # hf compiles on CUDA
