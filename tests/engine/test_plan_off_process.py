"""A process whose kernel plan has no native kernel (`BRISK_KERNELS=off`, or a GPU default
device) chats without compiling or loading anything from kernels/csrc: a whole turn of
sampling, lookup decoding, a packed KV cache and a compiled decode step, in a fresh
process, then a look at what it holds. tests/kernels/test_plan.py checks the same for the
GPU plan inside this process, one entry point at a time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import json, os, sys
stand_in = sys.argv[2]
from brisk.kernels import plan
if stand_in == "gpu":  # a Mac's process: the plan reads the default device from here
    plan.current_device = lambda: "gpu"
from brisk.engine.models.loader import load_folder
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings

lm = load_folder(sys.argv[1], model_id="tiny")
steps = []
for settings in (
    dict(temperature=0.7, seed=3, spec_decode="on", lookup=True),
    dict(temperature=0.0, k_bits=8, v_bits=16, kv_quant_start=0),
    dict(temperature=0.0, spec_decode="off"),
):
    session = Session(lm, ChatSettings(model="tiny", max_tokens=12, **settings))
    done = next(e for e in session.send("The quick brown fox. The quick brown") if type(e).__name__ == "TurnFinished")
    steps.append(done.metrics.decode_step)
from brisk.kernels import ctypes_library, mlx_extension

cache = os.environ["BRISK_KERNEL_CACHE"]
maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
print(json.dumps({
    "plan_native": plan.current().native,
    "compute_dtype": lm.compute_dtype,
    "decode_steps": steps,
    # what each loader holds, read without asking it (asking could build)
    "native": getattr(ctypes_library._state.get("loaded"), "value", None) is not None,
    "primitives": getattr(mlx_extension._state.get("loaded"), "value", None) is not None,
    "mapped": sorted({line.split()[-1] for line in maps.splitlines() if "brisk_" in line and ".so" in line}),
    "cache": sorted(os.listdir(cache)) if os.path.isdir(cache) else None,
}))
"""


@pytest.mark.parametrize("stand_in", ["off", "gpu"])
def test_a_process_without_native_kernels_chats_and_builds_none(tiny_llama_dir, tmp_path, stand_in):
    env = {**os.environ, "BRISK_KERNEL_CACHE": str(tmp_path / "kernels"), "BRISK_PREBUILT_KERNELS": str(tmp_path)}
    if stand_in == "off":
        env["BRISK_KERNELS"] = "off"
    else:
        env.pop("BRISK_KERNELS", None)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_llama_dir), stand_in],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert not seen["plan_native"] and seen["compute_dtype"] == "stored"
    assert seen["decode_steps"][0] == seen["decode_steps"][2] == "compiled"  # MLX's attention, compiled
    assert "packed KV" in seen["decode_steps"][1]
    assert not seen["native"] and not seen["primitives"]
    assert seen["mapped"] == []  # no kernel library in the process's memory
    assert seen["cache"] in (None, [])  # and none built
