"""Registry lookups and plug-in paths."""

from __future__ import annotations

import pytest

from npu_rl.utils.registry import Registry


def test_unknown_name_lists_known_and_suggests():
    reg = Registry("advantage estimator", "algorithm.adv_estimator")
    reg.register("grpo")(lambda: 1)
    reg.register("gae")(lambda: 2)
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'grpoo' \(config key algorithm.adv_estimator\)"
                                         r"\. Did you mean 'grpo'\? Known: gae, grpo"):
        reg.get("grpoo")


def test_plugin_from_file_and_module(tmp_path):
    plugin = tmp_path / "my_adv.py"
    plugin.write_text("def my_estimator():\n    return 42\n")
    reg = Registry("advantage estimator")
    assert reg.get(f"{plugin}:my_estimator")() == 42
    assert reg.get("os.path:join")("a", "b") == "a/b"


def test_plugin_errors_name_the_spec(tmp_path):
    plugin = tmp_path / "bad.py"
    plugin.write_text("x = 1\n")
    reg = Registry("policy loss")
    with pytest.raises(AttributeError, match="has no attribute 'nope'.*it defines: x"):
        reg.get(f"{plugin}:nope")
    with pytest.raises(FileNotFoundError, match="no such file"):
        reg.get(f"{tmp_path}/missing.py:f")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ImportError, match="importing .*broken.py failed: RuntimeError: boom"):
        reg.get(f"{broken}:f")


def test_duplicate_registration_refused():
    reg = Registry("thing")
    reg.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
