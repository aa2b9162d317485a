"""The kernel plan (kernels/plan.py): one decision per machine, from the device, the CPU's
features and the overrides, which every kernel wrapper and `brisk info` read.

The CPU classes are built from /proc/cpuinfo flag sets, so every class is decided on any
host; what runs on this host is checked against its own plan.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from brisk.kernels import ctypes_library, mlx_extension, plan, quantized_matmul
from brisk.kernels.plan import Cpu, decide

AVX2 = {"avx2", "fma", "f16c"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
VNNI = AVX512 | {"avx512_vnni", "avx512vbmi"}
AMX = VNNI | {"amx_tile", "amx_int8"}
CPUS = {
    "sapphire rapids": Cpu("Intel Xeon (AMX)", "x86_64", frozenset(AMX)),
    "zen 4": Cpu("AMD EPYC (Zen 4)", "x86_64", frozenset(VNNI)),
    "skylake-x": Cpu("Intel Xeon (Skylake-SP)", "x86_64", frozenset(AVX512)),
    "zen 3": Cpu("AMD Ryzen (Zen 3)", "x86_64", frozenset(AVX2)),
    "graviton": Cpu("Neoverse-V1", "aarch64", frozenset({"fp", "asimd"})),
}


@pytest.mark.parametrize(
    "name,level,vnni,amx,tiled,float_gemm",
    [
        ("sapphire rapids", "amx", True, True, {6}, True),
        ("zen 4", "vnni", True, False, {4, 5, 6, 8}, True),
        ("skylake-x", "avx512", False, False, set(), True),
        ("zen 3", "avx2", False, False, set(), False),
        ("graviton", "portable", False, False, set(), False),
    ],
)
def test_each_cpu_class_gets_its_fastest_paths(name, level, vnni, amx, tiled, float_gemm):
    p = decide(device="cpu", cpu=CPUS[name], environ={})
    assert (p.level, p.vnni, p.amx, set(p.tiled_bits), p.float_gemm) == (level, vnni, amx, tiled, float_gemm)
    assert p.native and p.compute_dtype == "float32" and p.integer_x == (level != "portable")
    assert p.build_features == (("avx2", "fma", "f16c") if level != "portable" else ())


def test_amx_prefill_and_tiled_decode_share_a_model_by_bit_width():
    """AMX's prefill tiles read MLX's layout for 4, 5 and 8 bits; the 6-bit layers (Q6_K
    imports, 47% of Qwen-1.5B's decode on that CPU) take the column tiles."""
    p = decide(device="cpu", cpu=CPUS["sapphire rapids"], environ={})
    choices = p.choices()
    assert "6 bits in column tiles" in choices["quantized products, 1-32 rows"].kernel
    assert "4, 5, 8 bits on AMX tiles" in choices["quantized products, prefill"].kernel


@pytest.mark.parametrize("ceiling,level", [("avx2", "avx2"), ("avx512", "avx512"), ("vnni", "vnni"), ("amx", "amx")])
def test_an_isa_ceiling_lowers_the_plan_and_never_raises_it(ceiling, level):
    top = decide(device="cpu", cpu=CPUS["sapphire rapids"], environ={"BRISK_ISA": ceiling})
    assert top.level == level
    assert top.amx == (level == "amx") and top.vnni == (level in ("vnni", "amx"))
    low = decide(device="cpu", cpu=CPUS["zen 3"], environ={"BRISK_ISA": ceiling})
    assert low.level == "avx2" and not low.vnni and not low.float_gemm


def test_portable_builds_without_simd_flags_and_takes_no_wide_path():
    p = decide(device="cpu", cpu=CPUS["sapphire rapids"], environ={"BRISK_KERNELS": "portable"})
    assert p.level == "portable" and p.build_features == () and p.native
    assert not (p.integer_x or p.vnni or p.amx or p.tiled_bits or p.float_gemm)


def test_off_is_the_gpu_plan_on_the_cpu():
    off = decide(device="cpu", cpu=CPUS["zen 4"], environ={"BRISK_KERNELS": "off"})
    gpu = decide(device="gpu", cpu=CPUS["zen 4"], environ={})
    for p in (off, gpu):
        assert not p.native and p.compute_dtype == "stored"
        assert {c.kernel for c in p.choices().values()} == {"MLX"}
    assert "GPU" in gpu.choices()["decode attention"].why and "BRISK_KERNELS=off" in off.describe()[0]


def test_a_switch_turns_one_path_off_and_the_plan_says_so():
    p = decide(device="cpu", cpu=CPUS["zen 4"], environ={"BRISK_TILED": "0", "BRISK_FLOAT_GEMM": "0"})
    assert not p.tiled_bits and not p.float_gemm and p.vnni
    assert "BRISK_TILED=0" in p.describe()[0]
    assert "in MLX's layout" in p.choices()["quantized products, 1-32 rows"].kernel


@pytest.mark.parametrize("environ", [{"BRISK_KERNELS": "fast"}, {"BRISK_ISA": "avx1024"}])
def test_a_value_it_does_not_know_is_a_warning_not_a_failure(environ):
    p = decide(device="cpu", cpu=CPUS["zen 4"], environ=environ)
    assert p.mode == "auto" and p.ceiling is None and len(p.warnings) == 1
    assert p.describe()[-1].startswith("warning: ")


def test_every_layer_kind_has_a_choice_with_a_reason():
    for cpu in CPUS.values():
        for device in ("cpu", "gpu"):
            choices = decide(device=device, cpu=cpu, environ={}).choices()
            assert tuple(choices) == plan.LAYER_KINDS
            assert all(c.kernel and c.why for c in choices.values())


def test_the_switches_are_read_through_the_plan_only():
    with pytest.raises(KeyError):
        plan.switch_on("BRISK_SOMETHING_ELSE")


def test_this_hosts_wrappers_follow_its_plan():
    here = plan.current()
    assert quantized_matmul.VNNI == here.vnni and quantized_matmul.AMX == here.amx
    assert quantized_matmul.INTEGER_ACTIVATIONS == here.integer_x
    assert ctypes_library.cpu_features() == list(here.build_features)


def test_a_gpu_default_process_compiles_and_loads_no_kernel(monkeypatch, tmp_path):
    """A Mac's process (default device Metal) must not compile, load or call anything in
    kernels/csrc: stand in for the GPU by the device the plan reads."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a kernel build was attempted on a GPU-default process")

    monkeypatch.setattr(plan, "current_device", lambda: "gpu")
    monkeypatch.setattr(plan, "_current", {})
    monkeypatch.setattr(ctypes_library, "_state", {})
    monkeypatch.setattr(mlx_extension, "_state", {})
    monkeypatch.setattr(ctypes_library, "_build", refuse)
    monkeypatch.setattr(mlx_extension, "_build", refuse)
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path / "cache"))
    from brisk.kernels import sampling

    assert ctypes_library.load() is None and mlx_extension.load() is None
    assert "not the CPU" in ctypes_library.unavailable_reason()
    assert sampling.temperature_sampler(0.7) is None
    with pytest.raises(sampling.NativeUnsupported):
        sampling.sample_softmax_native(mx.zeros((1, 8)), 0.7)
    assert not (tmp_path / "cache").exists()
    assert plan.current().compute_dtype == "stored" and not plan.current().native


def test_a_gpu_default_process_loads_a_model_in_its_stored_dtype_with_mlxs_layers(monkeypatch, tiny_llama_dir):
    import mlx.nn as nn

    from brisk.engine.models.loader import load_folder

    gpu_plan = decide(device="gpu", cpu=plan.read_cpu(), environ={})
    monkeypatch.setattr(plan, "_current", {"plan": gpu_plan})
    loaded = load_folder(tiny_llama_dir)
    assert loaded.compute_dtype == "stored"
    types = {type(m) for _, m in loaded.model.named_modules()}
    assert not any(t.__module__.startswith("brisk.kernels.") for t in types)
    assert nn.Linear in types or nn.QuantizedLinear in types
