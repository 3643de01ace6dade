"""The embedded model is converted once per machine even when several processes (ranks) start together."""

from __future__ import annotations

import os
import threading
import time

from npu_rl.models import loader


def test_concurrent_first_uses_convert_once(tmp_path, monkeypatch):
    out_dir = str(tmp_path / "smollm2-135m-instruct")
    calls = []

    def fake_convert(name, folder):  # what the real conversion leaves: a complete folder, renamed into place
        calls.append(name)
        time.sleep(0.3)  # long enough that the other caller arrives while this one is converting
        os.makedirs(folder)
        open(os.path.join(folder, "config.json"), "w").write("{}")

    monkeypatch.setattr(loader, "_convert_gguf_locked", fake_convert)
    threads = [threading.Thread(target=loader._convert_gguf, args=("smollm2-135m-instruct", out_dir))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert calls == ["smollm2-135m-instruct"]  # without the lock: three conversions, and os.makedirs fails twice
    assert os.path.isfile(os.path.join(out_dir, "config.json"))
