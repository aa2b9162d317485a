"""Child process for `brisk bench blas`: prints one JSON line of GFLOP/s."""

import json
import time

import brisk.engine  # noqa: F401  (applies BRISK_BLAS before mlx loads)
from brisk.engine.runtime.blas import blas_state


def gflops(m: int, k: int, n: int, repeats: int) -> float:
    import mlx.core as mx

    a, w = mx.random.normal((m, k)), mx.random.normal((n, k))
    mx.eval(a, w, a @ w.T)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(a @ w.T)
        times.append(time.perf_counter() - t)
    return 2 * m * k * n / sorted(times)[len(times) // 2] / 1e9


if __name__ == "__main__":
    state = blas_state()
    print(
        json.dumps(
            {
                "blas": state.name,
                "library": state.sgemm_provider,
                "sgemm_1024": gflops(1024, 1024, 1024, 3),
                "matvec_4096": gflops(1, 4096, 4096, 20),
            }
        )
    )
