"""`npu-rl bench trl`: the arguments each side gets (no TRL needed)."""

from __future__ import annotations

from npu_rl.commands.bench_trl import side_argv


def test_each_side_gets_the_arguments_without_out_and_its_value():
    # on the H200 the value of --out reached our side as a config override and npu-rl train refused it
    argv = ["--engine", "vllm", "--out", "/root/out/x.json", "--steps", "3", "--out=/y.json", "a.b=1"]
    assert side_argv(argv) == ["--engine", "vllm", "--steps", "3", "a.b=1"]
