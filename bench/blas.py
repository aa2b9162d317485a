"""`brisk bench blas`: MLX matmul speed with its reference BLAS vs the one Brisk loads.

Each variant runs in its own process (the BLAS is chosen before mlx is imported),
alternating order, medians over rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from brisk.bench.common import interleave, median, print_table
from brisk.engine.runtime.python_argv import module_argv

PROBE = "brisk.bench.blas_probe"


def _probe(blas: str) -> dict:
    env = dict(os.environ, BRISK_BLAS=blas)
    out = subprocess.run(module_argv(PROBE), env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_blas(*, runs: int, as_json: bool) -> dict:
    res = interleave(runs, {"reference": lambda: _probe("reference"), "brisk": lambda: _probe("auto")})
    ref, brisk = res["reference"], res["brisk"]
    payload: dict[str, Any] = {
        "runs": runs,
        "brisk_blas": brisk[0]["blas"],
        "brisk_library": brisk[0]["library"],
        "reference_library": ref[0]["library"],
        "shapes": [],
    }
    rows = []
    for key, label in (("sgemm_1024", "sgemm 1024^3"), ("matvec_4096", "x @ W.T, 1x4096x4096")):
        r, b = median(ref, key), median(brisk, key)
        payload["shapes"].append({"shape": label, "reference_gflops": r, "brisk_gflops": b, "speedup": b / r})
        rows.append([label, r, b, b / r])
    print_table(
        f"brisk bench blas: GFLOP/s, medians of {runs} (brisk uses {payload['brisk_blas']})",
        ["shape", "reference", "brisk", "speedup"],
        rows,
        payload,
        as_json,
    )
    return payload
