"""Device selection and the NPU path, tested with a stand-in torch_npu (no Ascend hardware here)."""

from __future__ import annotations

import os
import re
import sys
import types

import pytest
import torch

from npu_rl.device import DeviceUnavailableError, ascend_facts, backend as backend_mod, flops, npu_patches, select_backend
from tests.conftest import REPO_ROOT


@pytest.fixture(autouse=True)
def _no_device_env(monkeypatch):
    monkeypatch.delenv("DEVICE", raising=False)
    monkeypatch.delenv("NPU_RL_PEAK_TFLOPS", raising=False)


def test_auto_on_this_machine_is_cpu():
    backend = select_backend("auto")
    assert (backend.name, backend.dist_backend, backend.ray_resource, backend.visible_devices_env) == (
        "cpu", "gloo", None, None)
    assert backend.device() == torch.device("cpu")
    assert backend.graph_class is None


def test_device_env_is_read(monkeypatch):
    monkeypatch.setenv("DEVICE", "cpu")
    assert select_backend().name == "cpu"


def test_explicit_npu_without_torch_npu_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu -> ImportError
    with pytest.raises(DeviceUnavailableError, match=r"DEVICE=npu was requested but torch_npu is not importable.*"
                                                     r"pip install torch-npu"):
        select_backend("npu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_explicit_cuda_without_gpu_fails_clearly():
    with pytest.raises(DeviceUnavailableError, match="DEVICE=cuda was requested but torch.cuda.is_available"):
        select_backend("cuda")


def test_unknown_device_name():
    with pytest.raises(ValueError, match="DEVICE='tpu' is not valid; expected one of auto, npu, cuda, cpu"):
        select_backend("tpu")


def test_get_backend_refuses_to_switch(monkeypatch):
    monkeypatch.setattr(backend_mod, "_BACKEND", None)
    assert backend_mod.get_backend("cpu").name == "cpu"
    assert backend_mod.get_backend().name == "cpu"
    with pytest.raises(DeviceUnavailableError, match="already chosen as 'cpu'"):
        backend_mod.get_backend("npu")


# ------------------------------------------------------------------------------------------ a stand-in torch_npu
class _FakeNpuConfig:
    """Like torch_npu's ``torch.npu.config``: its class defines only ``__setattr__`` (so ``hasattr(config,
    "allow_internal_format")`` is False on the real package); here assignments are recorded."""

    def __init__(self):
        object.__setattr__(self, "assigned", {})

    def __setattr__(self, name, value):
        self.assigned[name] = value


class _FakeNpuModule(types.SimpleNamespace):
    """Enough of torch.npu for selection, seeding and the patches."""

    def __init__(self):
        super().__init__(calls=[], config=_FakeNpuConfig())

    def is_available(self):
        return True

    def device_count(self):
        return 2

    def current_device(self):
        return 0

    def set_compile_mode(self, jit_compile=False):
        self.calls.append(("set_compile_mode", jit_compile))

    def manual_seed_all(self, seed):
        self.calls.append(("manual_seed_all", seed))

    def get_device_name(self, index=0):
        return "Ascend910B3"


def _with_real_signature(name, impl):
    """A stand-in op that refuses calls the real op's signature would refuse."""
    sig = ascend_facts.signature(name)

    def op(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        return impl(*bound.args, **bound.kwargs)

    op.__signature__ = sig
    return op


def test_stand_in_exposes_only_the_real_torch_npu_api():
    fake = _FakeNpuModule()
    public = {n for n in dir(fake) if not n.startswith("_")} - {"calls"}
    assert public <= set(ascend_facts.TORCH_NPU_DEVICE_API), public - set(ascend_facts.TORCH_NPU_DEVICE_API)
    assert ascend_facts.signature("set_compile_mode") == __import__("inspect").signature(fake.set_compile_mode)


@pytest.fixture
def fake_npu(monkeypatch):
    import transformers.models.llama.modeling_llama as llama
    import transformers.models.qwen2.modeling_qwen2 as qwen2

    fake_module = _FakeNpuModule()
    fake_torch_npu = types.ModuleType("torch_npu")
    # recognisably not the real ops, with the real signatures (npu_rl/device/ascend_facts.py)
    fake_torch_npu.npu_rms_norm = _with_real_signature("npu_rms_norm", lambda x, w, epsilon=1e-6: (x * w * 2.0, None))
    fake_torch_npu.npu_rotary_mul = _with_real_signature("npu_rotary_mul", lambda x, r1, r2, rotary_mode="half": x + 1)

    def swiglu(x, dim=-1):  # the real op's arithmetic: silu(first half) * second half
        a, b = x.chunk(2, dim=dim)
        return torch.nn.functional.silu(a) * b

    fake_torch_npu.npu_swiglu = _with_real_signature("npu_swiglu", swiglu)
    fake_torch_npu.swiglu_calls = []
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu)
    monkeypatch.setattr(torch, "npu", fake_module, raising=False)
    monkeypatch.setattr(npu_patches, "_APPLIED", False)
    monkeypatch.delenv("TASK_QUEUE_ENABLE", raising=False)
    # The patches replace class attributes: monkeypatch restores them after the test.
    monkeypatch.setattr(qwen2.Qwen2RMSNorm, "forward", qwen2.Qwen2RMSNorm.forward)
    monkeypatch.setattr(qwen2, "apply_rotary_pos_emb", qwen2.apply_rotary_pos_emb)
    monkeypatch.setattr(llama.LlamaRMSNorm, "forward", llama.LlamaRMSNorm.forward)
    monkeypatch.setattr(qwen2.Qwen2MLP, "forward", qwen2.Qwen2MLP.forward)
    monkeypatch.setattr(llama.LlamaMLP, "forward", llama.LlamaMLP.forward)
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", llama.apply_rotary_pos_emb)
    try:
        import transformers.models.qwen3.modeling_qwen3 as qwen3

        monkeypatch.setattr(qwen3.Qwen3RMSNorm, "forward", qwen3.Qwen3RMSNorm.forward)
        monkeypatch.setattr(qwen3.Qwen3MLP, "forward", qwen3.Qwen3MLP.forward)
        monkeypatch.setattr(qwen3, "apply_rotary_pos_emb", qwen3.apply_rotary_pos_emb)
    except ImportError:
        pass
    return fake_module


def test_auto_prefers_npu_when_torch_npu_sees_a_device(fake_npu):
    backend = select_backend("auto")
    assert (backend.name, backend.dist_backend, backend.visible_devices_env, backend.ray_resource) == (
        "npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "NPU")
    assert backend.device_count() == 2
    assert backend.peak_flops() == 354e12


def test_npu_patches_apply_once(fake_npu):
    import transformers.models.qwen2.modeling_qwen2 as qwen2

    select_backend("npu")
    select_backend("npu")  # second selection: no second application
    assert fake_npu.calls.count(("set_compile_mode", False)) == 1
    assert not hasattr(fake_npu.config, "allow_internal_format")  # as on the real package: assigned, not asked
    assert fake_npu.config.assigned == {"allow_internal_format": False}
    assert "TASK_QUEUE_ENABLE" not in os.environ  # torch_npu reads it at import: the launch script sets it
    report = {r.target: r for r in npu_patches.REPORT}
    assert all(r.applied for r in report.values()), [r for r in report.values() if not r.applied]
    assert "transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb" in report
    norm = qwen2.Qwen2RMSNorm(4)
    x = torch.ones(1, 4)
    torch.testing.assert_close(norm(x), torch.full((1, 4), 2.0))  # went through the fake npu_rms_norm
    q = torch.zeros(1, 1, 2, 4)
    q_out, k_out = qwen2.apply_rotary_pos_emb(q, q, torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))
    torch.testing.assert_close(q_out, torch.ones_like(q))


def test_npu_patch_report_names_what_did_not_take(fake_npu, monkeypatch):
    import transformers.models.qwen2.modeling_qwen2 as qwen2

    class Attention(torch.nn.Module):  # a release whose attention no longer looks the rotary function up by name
        def forward(self, x):
            return x

    monkeypatch.setattr(qwen2, "Qwen2Attention", Attention)
    monkeypatch.delattr(_FakeNpuModule, "set_compile_mode")
    report = {r.target: r for r in npu_patches.apply_once()}
    rotary = report["transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb"]
    assert not rotary.applied and "does not look up apply_rotary_pos_emb" in rotary.why
    assert not report["torch.npu.set_compile_mode(jit_compile=False)"].applied
    assert report["transformers.models.llama.modeling_llama.apply_rotary_pos_emb"].applied


def test_npu_seeding_reaches_the_device(fake_npu):
    select_backend("npu").manual_seed(7)
    assert ("manual_seed_all", 7) in fake_npu.calls


# ------------------------------------------------------------------------------------------ CPU backend figures
def test_rng_state_round_trip():
    backend = select_backend("cpu")
    backend.manual_seed(3)
    state = backend.rng_state()
    a = torch.rand(3)
    backend.set_rng_state(state)
    torch.testing.assert_close(torch.rand(3), a)


def test_memory_stats_and_peak(monkeypatch):
    backend = select_backend("cpu")
    stats = backend.memory_stats_gb()
    assert set(stats) == {"cpu_memory_used_gb", "max_memory_allocated_gb", "max_memory_reserved_gb"}
    assert stats["cpu_memory_used_gb"] > 0
    monkeypatch.setenv("NPU_RL_PEAK_TFLOPS", "12.5")
    assert backend.peak_flops() == 12.5e12


@pytest.mark.parametrize("name, peak", [("NVIDIA H200", 989e12), ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12),
                                        ("Ascend910B3", 354e12), ("NVIDIA A100-SXM4-80GB", 312e12)])
def test_peak_flops_table(name, peak):
    assert flops.peak_flops(name) == peak


def test_cpu_peak_scales_with_threads():
    assert flops.peak_flops("CPU", num_threads=4) == 4 * flops.peak_flops("CPU", num_threads=1)


# ------------------------------------------------------------------------------------------ only device/ names one
DEVICE_NAMES = re.compile(r"torch\.cuda|torch\.npu|[\"']cuda[\"']|[\"']npu[\"']")
# Files outside device/ whose purpose is to name devices: the doctor reports on each device kind, and the Ascend
# lowering tool passes triton-ascend's target name ("npu") to Triton's compiler.
DEVICE_TOOLS = {os.path.join("npu_rl", "commands", "doctor.py"), os.path.join("kernels", "ascend_lowering.py")}


def test_no_device_names_outside_the_device_layer():
    offenders = []
    package = os.path.join(REPO_ROOT, "npu_rl")
    walked = [w for folder in ("npu_rl", "kernels", "configs") for w in os.walk(os.path.join(REPO_ROOT, folder))]
    for root, _, files in walked:
        if os.path.relpath(root, package).split(os.sep)[0] == "device":
            continue
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                if os.path.relpath(path, REPO_ROOT) in DEVICE_TOOLS:
                    continue
                with open(path, encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        if DEVICE_NAMES.search(line):
                            offenders.append(f"{os.path.relpath(path, REPO_ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "device names outside npu_rl/device/:\n" + "\n".join(offenders)


def test_npu_probe_survives_torch_npu_failing_to_load(monkeypatch):
    """torch_npu raises RuntimeError (not ImportError) when CANN's libraries cannot load: the probe reports it."""
    real_import = backend_mod.importlib.import_module

    def failing(name, *args):
        if name == "torch_npu":
            raise RuntimeError("libhccl.so: cannot open shared object file")
        return real_import(name, *args)

    monkeypatch.setattr(backend_mod.importlib, "import_module", failing)
    ok, why = backend_mod._npu_probe()
    assert not ok and "torch_npu failed to load (libhccl.so" in why and "set_env.sh" in why


def test_cli_turns_torch_backend_autoload_failure_into_a_hint(monkeypatch, capsys):
    from npu_rl import cli

    def doctor(argv):
        try:
            raise OSError("libascendcl.so: cannot open shared object file")
        except OSError as err:  # what torch/__init__.py's _import_device_backends raises
            raise RuntimeError("Failed to load the backend extension: torch_npu. You can disable extension "
                               "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.") from err

    monkeypatch.setitem(cli.COMMANDS, "doctor", doctor)
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert "libascendcl.so" in err and "set_env.sh" in err and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in err



def test_swiglu_patch_matches_the_mlp_and_keeps_other_activations(fake_npu, monkeypatch):
    """Qwen2MLP through npu_swiglu (the stand-in computes what the real op does) gives the eager MLP's output;
    an MLP with another activation keeps its own forward."""
    import transformers.models.qwen2.modeling_qwen2 as qwen2
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=8, intermediate_size=12, hidden_act="silu")
    torch.manual_seed(0)
    mlp, x = qwen2.Qwen2MLP(config), torch.randn(2, 3, 8)
    expected = mlp(x)
    calls = []
    real = sys.modules["torch_npu"].npu_swiglu
    monkeypatch.setattr(sys.modules["torch_npu"], "npu_swiglu", lambda t, dim=-1: calls.append(t.shape) or real(t, dim))
    report = {r.target: r for r in select_backend("npu") and npu_patches.REPORT}
    assert report["transformers.models.qwen2.modeling_qwen2.Qwen2MLP.forward"].applied
    torch.testing.assert_close(mlp(x), expected)
    assert calls == [torch.Size([2, 3, 24])]  # gate and up concatenated, one fused call
    gelu = qwen2.Qwen2MLP(Qwen2Config(hidden_size=8, intermediate_size=12, hidden_act="gelu"))
    gelu(x)
    assert len(calls) == 1  # not SiLU: the MLP's own forward
    from npu_rl.device.patch_toggles import patch_variants

    with dict(patch_variants("npu"))["swiglu"]():
        mlp(x)
        assert len(calls) == 1  # undone inside the toggle
    mlp(x)
    assert len(calls) == 2


@pytest.mark.parametrize("avx2, avx512_bf16, amx, native", [
    (True, False, False, False),  # AVX2 only (this machine's AMD EPYC): bf16 is emulated through fp32
    (True, True, False, True),
    (True, False, True, True),
    (False, False, False, True),  # not x86 (or no AVX2): taken at its word
])
def test_cpu_native_bf16_probe(monkeypatch, avx2, avx512_bf16, amx, native):
    monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: avx2, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert select_backend("cpu").computes_bf16_natively() is native


def test_cpu_native_bf16_probe_without_torch_probes(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    assert select_backend("cpu").computes_bf16_natively() is True
