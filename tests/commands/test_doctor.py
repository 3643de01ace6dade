"""``npu-rl doctor``: vLLM-Ascend's compatibility matrix and the settings known to break RL on Ascend, fed each bad
combination (no Ascend packages needed: versions and environments are given)."""

from __future__ import annotations

import pytest

from npu_rl.device import ascend_matrix as matrix
from npu_rl.commands.doctor import combination_problems, matrix_problems, settings_problems

GOOD_011 = {"vllm-ascend": "0.11.0", "vllm": "0.11.0", "torch": "2.7.1", "torch-npu": "2.7.1.post1",
            "numpy": "1.26.4", "triton-ascend": None, "triton": None}


def test_version_parsing_rc_post_local_and_cann():
    assert matrix.parse("v0.11.0rc1") < matrix.parse("0.11.0") < matrix.parse("0.11.0.post1")
    assert matrix.parse("2.9.0.post1+git4c901a4") == matrix.parse("2.9.0.post1")
    assert matrix.same_release("2.7.1.post1", "2.7.1") and matrix.same_release("3.2.0rc4", "3.2.0")
    assert not matrix.same_release("2.8.0", "2.7.1") and matrix.parse("not a version") is None
    assert matrix.cann_matches("8.3.RC1", "8.3.RC1") and matrix.cann_matches("8.3.rc1.alpha002", "8.3.RC1")
    assert not matrix.cann_matches("8.2.RC1", "8.3.RC1")
    assert matrix.release_for("0.11.0rc1").cann == "8.3.RC1" and matrix.release_for("0.99.0") is None


def test_matrix_rows_are_well_formed_and_ordered():
    seen = set()
    for row in matrix.MATRIX:
        assert matrix.parse(row.vllm_ascend) and all(matrix.parse(v) for v in row.vllm), row
        assert matrix.same_release(row.torch, row.torch_npu), row  # torch_npu is built for that torch
        assert row.vllm_ascend not in seen
        seen.add(row.vllm_ascend)
    assert {"0.11.0rc1", "0.11.0", "0.13.0", "0.23.0", "0.24.0rc1"} <= seen


def test_torch_npu_post_release_is_not_flagged():
    assert matrix_problems(GOOD_011, "3.11.7", "8.3.RC2") == ([], [])
    problems, notes = matrix_problems({**GOOD_011, "torch-npu": "2.7.1"}, "3.11.7", "8.3.RC2")
    assert problems == [] and notes == ["torch-npu 2.7.1: vllm-ascend 0.11.0's matrix names 2.7.1.post1 (same "
                                        "release)"]
    assert combination_problems({"torch": "2.7.1", "torch-npu": "2.7.1.post1"}) == []
    assert combination_problems({"torch": "2.7.1", "torch-npu": "2.7.1rc1"}) == []  # rc of the same release
    assert "built for torch" in combination_problems({"torch": "2.8.0", "torch-npu": "2.7.1.post1"})[0]


@pytest.mark.parametrize("change, expected", [
    ({"vllm": "0.11.1"}, "built for vllm 0.11.0, found vllm 0.11.1"),
    ({"vllm": None}, "vllm is not installed"),
    ({"torch": "2.8.0"}, "needs torch 2.7.1, found 2.8.0"),
    ({"torch-npu": "2.8.0"}, "needs torch-npu 2.7.1.post1, found 2.8.0"),
    ({"vllm-ascend": "0.13.0", "vllm": "0.13.0", "torch": "2.8.0", "torch-npu": "2.8.0.post2",
      "triton-ascend": "3.2.1"}, "needs triton-ascend 3.2.0, found 3.2.1"),
])
def test_matrix_mismatches(change, expected):
    problems, _ = matrix_problems({**GOOD_011, **change}, "3.11.7", None)
    assert any(expected in p for p in problems), problems


def test_matrix_python_cann_and_unknown_release():
    problems, notes = matrix_problems(GOOD_011, "3.12.1", "8.2.RC1")
    assert any("supports Python >=3.9,<3.12" in p for p in problems)
    assert any("CANN 8.2.RC1 found" in n for n in notes)
    problems, notes = matrix_problems({**GOOD_011, "vllm-ascend": "0.99.0"}, "3.11.7", None)
    assert problems == [] and "newer than npu-rl's matrix" in notes[0]  # runs, said to be unchecked
    assert any(n.startswith("(not checked) vllm-ascend 0.99.0 is built for vllm 0.30.0") for n in notes)
    assert "not in the compatibility matrix" in matrix_problems({**GOOD_011, "vllm-ascend": "0.6.0"})[1][0]
    # rc versions from the images (triton-ascend 3.2.0rc4) satisfy a 3.2.0 row
    v013 = {**GOOD_011, "vllm-ascend": "0.13.0", "vllm": "0.13.0", "torch": "2.8.0", "torch-npu": "2.8.0.post2",
            "triton-ascend": "3.2.0rc4"}
    assert matrix_problems(v013, "3.11.7", "8.5.0")[0] == []


@pytest.mark.parametrize("env, versions, expected", [
    ({"VLLM_ASCEND_ENABLE_NZ": "1"}, GOOD_011, "VLLM_ASCEND_ENABLE_NZ=1 with vLLM sleep mode"),
    ({"ASCEND_LAUNCH_BLOCKING": "1"}, GOOD_011, "ASCEND_LAUNCH_BLOCKING=1 with ACL graphs"),
    ({"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}, GOOD_011, "expandable_segments:True with vLLM sleep"),
    ({}, {**GOOD_011, "numpy": "2.1.0"}, "numpy 2.1.0 with vllm-ascend 0.11.0, which requires numpy<2.0.0"),
], ids=["nz-sleep", "launch-blocking-graphs", "expandable-sleep", "numpy2-old-ascend"])
def test_bad_settings(env, versions, expected):
    problems, _ = settings_problems(env, versions)
    assert len(problems) == 1 and expected in problems[0], problems


def test_settings_that_are_fine_and_notes():
    assert settings_problems({"VLLM_ASCEND_ENABLE_NZ": "1"}, GOOD_011, sleep_mode=False)[0] == []
    assert settings_problems({"ASCEND_LAUNCH_BLOCKING": "1"}, GOOD_011, graphs=False)[0] == []
    assert settings_problems({}, {**GOOD_011, "vllm-ascend": "0.23.0", "numpy": "2.1.0"})[0] == []
    _, notes = settings_problems({}, GOOD_011)
    assert any("has no NPUWorker.reload_weights" in n for n in notes)
    assert any("ignores logprobs_mode" in n for n in notes)
    _, notes = settings_problems({}, {**GOOD_011, "vllm-ascend": "0.24.0rc1"})
    assert not any("reload_weights" in n for n in notes)


NEW = {**GOOD_011, "vllm-ascend": "0.30.0rc2", "vllm": "0.30.0", "torch": "2.10.0", "torch-npu": "2.10.0.post4",
       "triton-ascend": "3.2.2", "numpy": "2.2.0"}


def test_nz_check_reads_the_effective_value_per_release():
    """vllm-ascend >= 0.27.1rc1 ignores VLLM_ASCEND_ENABLE_NZ: the doctor looks at additional_config there."""
    problems, notes = settings_problems({"VLLM_ASCEND_ENABLE_NZ": "0"}, NEW)
    assert problems == []
    assert any("npu-rl's vLLM engine on vllm-ascend 0.30.0rc2: weight_nz_mode=0" in n for n in notes)
    assert any("is ignored by vllm-ascend 0.30.0rc2" in n for n in notes)  # verl-style setups break there
    problems, _ = settings_problems({}, NEW, additional_config={"weight_nz_mode": 1})
    assert len(problems) == 1 and "weight_nz_mode=1 with vLLM sleep mode" in problems[0]
    assert settings_problems({"VLLM_ASCEND_ENABLE_NZ": "1"}, NEW)[0] == []  # not read by 0.30: not the cause
    _, notes = settings_problems({}, NEW, sleep_mode=False, additional_config={"weight_nz_mode": 2})
    assert any("weight_nz_mode=2 (effective)" in n for n in notes)


def test_matrix_nearest_and_newer_releases():
    _, notes = matrix_problems({**NEW, "vllm-ascend": "0.30.0rc2"}, "3.11.7", "9.2.0")
    assert any("using the row of 0.30.0rc1" in n for n in notes)
    problems, notes = matrix_problems({**NEW, "vllm-ascend": "0.31.0"}, "3.11.7", "9.2.0")
    assert problems == [] and any("newer than npu-rl's matrix" in n and "not checked" in n for n in notes)


def test_a_cuda_torchvision_beside_a_cpu_torch_names_both_fixes():
    problems = combination_problems({"torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": "2.13.0"})
    vision = next(p for p in problems if p.startswith("torchvision"))
    assert "breaks `import vllm`; pip uninstall -y torchvision" in vision
    assert "Qwen-VL actor on vLLM needs torchvision: install the +cpu build" in vision
    audio = next(p for p in problems if p.startswith("torchaudio"))
    assert audio.endswith("pip uninstall -y torchaudio")
    assert not [p for p in combination_problems({"torch": "2.13.0+cpu", "torchvision": "0.28.0+cpu"})
                if p.startswith("torchvision")]
