"""The kernel plan: which kernel runs for each kind of layer on this machine, and why.

Decided in one place from the default device, the CPU's features, which native libraries
loaded, and two documented overrides. The kernel modules read the plan (its switches) and
`brisk info` and the benchmarks print it, so nobody has to guess what a machine ran.

Overrides (environment, read once when the plan is first decided):

- `BRISK_KERNELS=auto|portable|off` (default `auto`). `portable`: the kernels built with no
  x86 SIMD flags and none of the VNNI, AMX or AVX-512 paths (what an arm64 CPU runs). `off`:
  no native kernel at all and weights in their stored dtype, MLX's own paths on the CPU:
  what a GPU device (a Mac's Metal) gets, so CI can test that plan's logic.
- `BRISK_ISA=avx2|avx512|vnni|amx`: a ceiling. Paths above it are not chosen even where the
  CPU has them, here and inside the C++ (kernels/csrc/isa.h reads the same variables).

The A/B partners of the benchmarks (each `1` by default; `0` turns one path off):

| variable | path it turns off |
|---|---|
| `BRISK_NATIVE_KERNELS` | every native kernel (as `BRISK_KERNELS=off`, but weights still float32) |
| `BRISK_MLX_PRIMITIVES` | the kernels as lazy MLX primitives (eager ctypes calls remain) |
| `BRISK_INTEGER_ACTIVATIONS` | x rounded to integers for few-row quantized products |
| `BRISK_VNNI` | VNNI-512 integer products (AVX2's remain) |
| `BRISK_AMX` | AMX tiles for prefill's quantized products (sgemm remains) |
| `BRISK_TILED` | quantized weights repacked in column tiles |
| `BRISK_SCALE_CODES` | K-quant scales stored as codes in the tiled layout |
| `BRISK_FLOAT_GEMM` | the AVX-512 float GEMM for float32 prefill (MKL remains) |

Other settings the kernels read: `BRISK_KERNEL_THREADS` (threads per kernel call, default
the cores), `BRISK_KERNEL_CACHE` (where local builds go), `BRISK_PREBUILT_KERNELS` (a
folder of prebuilt kernels with their manifest).
"""

from __future__ import annotations

import logging
import os
import platform
import threading
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MODES = ("auto", "portable", "off")
# CPU classes, lowest first. Each includes those before it (every AMX CPU has VNNI-512).
LEVELS = ("portable", "avx2", "avx512", "vnni", "amx")
CEILINGS = LEVELS[1:]
# /proc/cpuinfo flags each class needs.
LEVEL_FLAGS = {
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "vnni": ("avx512_vnni",),
    "amx": ("amx_tile", "amx_int8", "avx512vbmi"),
}
# Bit widths amx_matmul.cpp takes; the others (6: Q6_K imports) read tiles on AMX CPUs too.
AMX_BITS = frozenset({4, 5, 8})
QUANTIZED_BITS = frozenset({4, 5, 6, 8})
SWITCHES = (
    "BRISK_NATIVE_KERNELS",
    "BRISK_MLX_PRIMITIVES",
    "BRISK_INTEGER_ACTIVATIONS",
    "BRISK_VNNI",
    "BRISK_AMX",
    "BRISK_TILED",
    "BRISK_SCALE_CODES",
    "BRISK_FLOAT_GEMM",
)


def switch_on(name: str) -> bool:
    """An A/B switch from the table above, read now (tests and benchmarks flip them per run)."""
    if name not in SWITCHES:
        raise KeyError(f"{name} is not one of the kernel plan's switches")
    return os.environ.get(name, "1") != "0"


@dataclass(frozen=True)
class Cpu:
    name: str
    machine: str  # platform.machine(): x86_64, aarch64, arm64
    flags: frozenset[str]

    @property
    def level(self) -> str:
        """The highest class this CPU fully has."""
        if self.machine.lower() not in ("x86_64", "amd64"):
            return "portable"
        have = "portable"
        for level in LEVELS[1:]:
            if not all(flag in self.flags for flag in LEVEL_FLAGS[level]):
                break
            have = level
        return have


def read_cpu() -> Cpu:
    name, flags = platform.processor() or platform.machine(), frozenset[str]()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            name = value.strip()
        elif key.strip() == "flags":
            flags = frozenset(value.split())
        if flags and name:
            break
    return Cpu(name, platform.machine(), flags)


@dataclass(frozen=True)
class Choice:
    kernel: str
    why: str


@dataclass(frozen=True)
class KernelPlan:
    device: str  # "cpu" or "gpu"
    mode: str  # BRISK_KERNELS
    ceiling: str | None  # BRISK_ISA
    cpu: Cpu
    switches: dict[str, bool]
    warnings: tuple[str, ...] = field(default=())

    @property
    def level(self) -> str:
        """The CPU class the plan targets: the CPU's, lowered by BRISK_ISA and `portable`."""
        if self.mode == "portable":
            return "portable"
        have = LEVELS.index(self.cpu.level)
        if self.ceiling is not None:
            have = min(have, LEVELS.index(self.ceiling))
        return LEVELS[have]

    def at_least(self, level: str) -> bool:
        return LEVELS.index(self.level) >= LEVELS.index(level)

    @property
    def native(self) -> bool:
        """Whether any native kernel is built or loaded: the CPU device only."""
        return self.device == "cpu" and self.mode != "off" and self.switches["BRISK_NATIVE_KERNELS"]

    @property
    def compute_dtype(self) -> str:
        """float32 where the CPU kernels run (half-precision matmuls are ~40x slower on MLX's
        CPU: shared/CPU.md); on a GPU, and as its stand-in (`off`), the stored dtype."""
        return "float32" if self.device == "cpu" and self.mode != "off" else "stored"

    @property
    def build_features(self) -> tuple[str, ...]:
        """The -m flags of a local build: AVX2, FMA and F16C from `avx2` up (wider paths are
        chosen at run time inside the library)."""
        if not self.at_least("avx2"):
            return ()
        return tuple(f for f in LEVEL_FLAGS["avx2"] if f in self.cpu.flags)

    @property
    def integer_x(self) -> bool:
        return self.native and self.at_least("avx2") and self.switches["BRISK_INTEGER_ACTIVATIONS"]

    @property
    def vnni(self) -> bool:
        return self.integer_x and self.at_least("vnni") and self.switches["BRISK_VNNI"]

    @property
    def amx(self) -> bool:
        return self.integer_x and self.at_least("amx") and self.switches["BRISK_AMX"]

    @property
    def tiled_bits(self) -> frozenset[int]:
        """Bit widths whose layers are repacked into column tiles. On an AMX CPU the widths its
        prefill tiles take keep MLX's layout (decode reads them with VNNI few-row products);
        6-bit layers, which AMX does not take, are tiled: their few-row path was 47% of
        Qwen-1.5B's decode there (shared/CPU.md)."""
        if not (self.vnni and self.switches["BRISK_TILED"]):
            return frozenset()
        return QUANTIZED_BITS - AMX_BITS if self.amx else QUANTIZED_BITS

    @property
    def float_gemm(self) -> bool:
        return self.native and self.at_least("avx512") and self.switches["BRISK_FLOAT_GEMM"]

    def choices(self) -> dict[str, Choice]:
        """Per layer kind, the kernel this plan runs and why."""
        if self.device != "cpu":
            mlx = Choice("MLX", f"the default device is the {self.device.upper()}: MLX's own kernels do all the work")
            return dict.fromkeys(LAYER_KINDS, mlx)
        if not self.native:
            why = "BRISK_KERNELS=off" if self.mode == "off" else "BRISK_NATIVE_KERNELS=0"
            return dict.fromkeys(LAYER_KINDS, Choice("MLX", f"native kernels turned off ({why})"))
        return {kind: decide(self) for kind, decide in _DECISIONS.items()}

    def describe(self) -> list[str]:
        """The plan as lines for `brisk info` and benchmark tables."""
        head = f"CPU {self.cpu.name} ({self.cpu.machine}, class {self.cpu.level})"
        limits = [f"BRISK_KERNELS={self.mode}"] + ([f"BRISK_ISA={self.ceiling}"] if self.ceiling else [])
        off = [name for name, on in self.switches.items() if not on]
        target = f"targets {self.level}" if self.native else "no native kernels"
        lines = [
            f"{head}; device {self.device}; {target} ({', '.join(limits + [f'{n}=0' for n in off])})",
            f"compute dtype {self.compute_dtype}",
        ]
        lines += [f"{kind}: {c.kernel} ({c.why})" for kind, c in self.choices().items()]
        return lines + [f"warning: {w}" for w in self.warnings]


def _quantized_few_rows(plan: KernelPlan) -> Choice:
    tiled = sorted(plan.tiled_bits)
    rest = sorted(QUANTIZED_BITS - plan.tiled_bits)
    parts = []
    if tiled:
        parts.append(f"{', '.join(map(str, tiled))} bits in column tiles, VNNI-512")
    if rest:
        if plan.vnni:
            how = "VNNI-512 integer x"
        elif plan.integer_x:
            how = "AVX2 integer x (8 bits as q - 128)"
        else:
            how = "float x"
        parts.append(f"{', '.join(map(str, rest))} bits in MLX's layout, {how}")
    why = "the CPU has VNNI-512" if plan.vnni else f"the plan targets {plan.level}"
    if plan.amx and tiled:
        why = "AMX prefill reads MLX's layout for 4, 5 and 8 bits; it does not take 6"
    return Choice("; ".join(parts), why)


def _quantized_prefill(plan: KernelPlan) -> Choice:
    amx = sorted(AMX_BITS - plan.tiled_bits) if plan.amx else []
    parts = [f"{', '.join(map(str, amx))} bits on AMX tiles"] if amx else []
    if plan.tiled_bits:
        parts.append(f"{', '.join(map(str, sorted(plan.tiled_bits)))} bits in column tiles, VNNI-512 pairs")
    rest = sorted(QUANTIZED_BITS - plan.tiled_bits - set(amx))
    if rest:
        parts.append(f"{', '.join(map(str, rest))} bits dequantized into tiles for sgemm")
    return Choice("; ".join(parts), "more than 32 rows: products that reuse each weight across rows")


def _float_products(plan: KernelPlan) -> Choice:
    if plan.float_gemm:
        return Choice("skinny kernel (few rows), AVX-512 float GEMM (prefill)", "the plan allows AVX-512")
    return Choice("skinny kernel (few rows), the BLAS (prefill)", f"the plan targets {plan.level}")


_DECISIONS = {
    "quantized products, 1-32 rows": _quantized_few_rows,
    "quantized products, prefill": _quantized_prefill,
    "float products": _float_products,
    "prefill attention": lambda p: Choice("native attention (row blocks, sgemm tiles, flash)", "float32 on the CPU"),
    "decode attention": lambda p: Choice("native attention, keys split across threads", "float32 on the CPU"),
    "packed-KV attention": lambda p: Choice("native int4/int8 KV attention", "MLX dequantizes the whole cache"),
    "norms and RoPE": lambda p: Choice("native one-node RMSNorm and RoPE", "MLX's CPU runs them as ~40 small ops"),
    "activation": lambda p: Choice("native SwiGLU", "one pass instead of three ops"),
    "sampling": lambda p: Choice("native softmax sampler", "MLX's Gumbel draw costs two logs per token of the vocab"),
    "sparse-prefill scoring": lambda p: Choice(
        "native pooled attention (softmax, pool, max over heads)", "MLX's CPU softmax pays a scalar exp per element"
    ),
}
LAYER_KINDS = tuple(_DECISIONS)


def decide(*, device: str, cpu: Cpu, environ: dict[str, str] | None = None) -> KernelPlan:
    """The plan for this device and CPU under these environment overrides."""
    env = os.environ if environ is None else environ
    warnings = []
    mode = env.get("BRISK_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        warnings.append(f"BRISK_KERNELS={mode!r} is not one of {', '.join(MODES)}; using auto")
        mode = "auto"
    ceiling: str | None = env.get("BRISK_ISA", "").strip().lower() or None
    if ceiling is not None and ceiling not in CEILINGS:
        warnings.append(f"BRISK_ISA={ceiling!r} is not one of {', '.join(CEILINGS)}; no ceiling")
        ceiling = None
    switches = {name: env.get(name, "1") != "0" for name in SWITCHES}
    plan = KernelPlan(device, mode, ceiling, cpu, switches, tuple(warnings))
    for warning in warnings:
        log.warning("kernel plan: %s", warning)
    return plan


_lock = threading.Lock()
_current: dict[str, KernelPlan] = {}


def current_device() -> str:
    import mlx.core as mx

    return "cpu" if mx.default_device() == mx.cpu else "gpu"


def current() -> KernelPlan:
    """This process's plan, decided on first use (the first model load) and kept."""
    plan = _current.get("plan")
    if plan is not None:
        return plan
    with _lock:
        if "plan" not in _current:
            _current["plan"] = decide(device=current_device(), cpu=read_cpu())
        return _current["plan"]


NOT_ON_CPU = "the default device is not the CPU: MLX's own kernels do the work"


def turned_off(*, primitives: bool = False) -> str | None:
    """Why no native kernel (or, with `primitives`, no MLX primitive) may be loaded, or None."""
    if current().mode == "off":
        return "turned off by BRISK_KERNELS=off"
    names = ("BRISK_NATIVE_KERNELS", "BRISK_MLX_PRIMITIVES") if primitives else ("BRISK_NATIVE_KERNELS",)
    for name in names:
        if not switch_on(name):
            return f"turned off by {name}=0"
    return None


def on_cpu_now() -> bool:
    """Whether work built now lands on the CPU: the native kernels are compiled and loaded only
    then, so a GPU-default process (a Mac) never builds them (a `with mx.stream(mx.cpu)` block
    in such a process still may)."""
    return current_device() == "cpu"
