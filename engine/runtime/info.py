"""What `brisk info` reports: backend, BLAS, dtype, memory; per model, KV bytes per token."""

from __future__ import annotations

import os
import platform
import time
from importlib.metadata import version

from brisk.engine.runtime.blas import blas_state


def _meminfo() -> dict[str, int]:
    try:
        with open("/proc/meminfo") as fh:
            rows = dict(line.split(":", 1) for line in fh)
        return {k: int(rows[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable")}
    except (OSError, KeyError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return {"MemTotal": total, "MemAvailable": total}


def memory_available() -> int:
    """Bytes the OS could give this process now (MemAvailable on Linux)."""
    return _meminfo()["MemAvailable"]


def quick_sgemm_gflops(n: int = 512, repeats: int = 3) -> float:
    """A ~10 ms probe that tells reference BLAS (~4 GFLOP/s) from an optimized one (>50)."""
    import mlx.core as mx

    a = mx.random.normal((n, n))
    b = mx.random.normal((n, n))
    mx.eval(a @ b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def _native_kernel_path() -> str:  # one library holds both CPU kernels
    from brisk.kernels import ctypes_library

    return "native CPU kernel" if ctypes_library.load() else f"portable MLX ({ctypes_library.unavailable_reason()})"


def _quantized_products() -> str:
    from brisk.kernels.quantized_matmul import integer_products
    from brisk.kernels.tiled_matmul import tiled_bits, why_not_tiled

    if why_not_tiled() is None:
        bits = ", ".join(map(str, sorted(tiled_bits())))
        return f"VNNI-512 integer x on weights repacked in column tiles ({bits} bits), decode to prefill"
    return integer_products()


def kernel_plan_lines() -> list[str]:
    """The kernel plan (kernels/plan.py): the CPU, and per layer kind the kernel and why."""
    from brisk.kernels import plan

    return plan.current().describe()


def describe_kernels(loaded) -> str:
    """One line: where a native library came from, and why when not prebuilt."""
    where = f" ({loaded.path})" if loaded.path else ""
    why = f"; {loaded.note}" if loaded.note else ""
    return f"{loaded.origin}{where}{why}"


def kernel_origins() -> dict[str, str]:
    """Which native libraries are prebuilt (a bundle's), built locally or fell back, and why."""
    from brisk.kernels import ctypes_library, mlx_extension

    return {
        "kernels_ctypes": describe_kernels(ctypes_library.status()),
        "kernels_mlx_ops": describe_kernels(mlx_extension.status()),
    }


def engine_info() -> dict:
    import mlx.core as mx

    from brisk.engine.models.loader import compute_dtype_name
    from brisk.engine.models.store import brisk_home

    state = blas_state()
    mem = _meminfo()
    return {
        "backend": f"mlx {version('mlx')} on {mx.default_device()}" + (" (Metal)" if mx.metal.is_available() else ""),
        "mlx_lm": version("mlx-lm"),
        "platform": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
        "blas": state.name,
        "blas_library": state.sgemm_provider or "-",
        "blas_note": state.note,
        "sgemm_gflops": round(quick_sgemm_gflops(), 1),
        "compute_dtype": compute_dtype_name(),
        "packed_kv_attention": _native_kernel_path(),
        "few_row_matmul": (
            _native_kernel_path()
            if compute_dtype_name() == "float32"
            else "MLX (the native kernel takes float32 on the CPU)"
        ),
        "quantized_products": _quantized_products(),
        **kernel_origins(),
        "kernel_plan": kernel_plan_lines(),
        "memory_total": f"{mem['MemTotal'] / 2**30:.1f} GiB",
        "memory_free": f"{mem['MemAvailable'] / 2**30:.1f} GiB",
        "brisk_home": str(brisk_home()),
    }


def model_memory_info(model_id: str, *, group_size: int = 32, precision: tuple[int, int] | None = None) -> dict:
    """Weights, and per KV precision (keys bits, values bits) the bytes per token and the
    longest context that fits in the memory available beside the weights (what
    Open-TQ-Metal reports as 73K -> 236K). `precision` adds a row for the chat's own choice."""
    from brisk.engine.kv.half import STORED_ITEMSIZE
    from brisk.engine.kv.packed_cache import kv_bytes_per_token, kv_shape
    from brisk.engine.models.folder import read_config
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    entry = store.get(model_id)
    config = read_config(store.path(model_id))
    args = config.get("text_config") or config
    shape = kv_shape(config)
    weights = entry.memory_bytes or entry.parameters * 4
    free = max(0, _meminfo()["MemAvailable"] - weights)
    rows = []
    choices: list[tuple[int, int]] = [(16, 16), (8, 8), (8, 4), (4, 4)]
    if precision and (precision[0], precision[1]) not in choices:
        choices.append((precision[0], precision[1]))
    for k_bits, v_bits in choices:
        if not shape or (v_bits < 16 and shape["head_dim"] % group_size):
            continue
        per_token = kv_bytes_per_token(
            args["num_hidden_layers"],
            shape["kv_heads"],
            shape["head_dim"],
            k_bits=k_bits,
            v_bits=v_bits,
            group_size=group_size,
            itemsize=STORED_ITEMSIZE,
        )
        rows.append(
            {
                "k_bits": k_bits,
                "v_bits": v_bits,
                "kv_bits": min(k_bits, v_bits),
                "bytes_per_token": per_token,
                "max_context": int(free // per_token),
            }
        )
    return {
        "id": model_id,
        "weights_bytes": weights,
        "context_length": entry.context_length,
        "free_bytes_beside_weights": free,
        "kv_group_size": group_size,
        "kv": rows,
    }
