"""Greedy answers of the real SmolLM2 under `BRISK_KERNELS=off` (MLX's own kernels in the
stored dtype: what a GPU runs) equal the native plan's (Brisk's CPU kernels in float32),
token for token. This process answers under its own plan, a child under the other."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from brisk.engine.api.events import TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.models.loader import load_model
from brisk.kernels import plan
from tests.conftest import REAL_MODEL

pytestmark = pytest.mark.real_model
PROMPTS = ["Write a haiku about the sea.", "List three prime numbers and explain why they are prime."]
MAX_TOKENS = 32

CHILD = r"""
import json, sys
from pathlib import Path
from tests.engine.test_plan_off_greedy import answers
from brisk.engine.models.store import ModelStore
print(json.dumps(answers(ModelStore(Path(sys.argv[1])))))
"""


def answers(store) -> dict:
    lm = load_model(REAL_MODEL, store=store)
    got: dict = {"compute_dtype": lm.compute_dtype, "native": plan.current().native}
    for prompt in PROMPTS:
        session = Session(lm, ChatSettings(model=REAL_MODEL, temperature=0.0, max_tokens=MAX_TOKENS))
        done = next(e for e in session.send(prompt) if isinstance(e, TurnFinished))
        got[prompt] = {"tokens": done.token_ids, "decode_step": done.metrics.decode_step}
    return got


def test_greedy_answers_under_off_equal_the_native_plan_s(real_store):
    here = answers(real_store)
    env = dict(os.environ)
    if here["native"]:
        env["BRISK_KERNELS"] = "off"
    else:
        env.pop("BRISK_KERNELS", None)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(real_store.home)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    there = json.loads(child.stdout.strip().splitlines()[-1])
    off, native = (there, here) if here["native"] else (here, there)
    assert native["native"] and native["compute_dtype"] == "float32"
    assert not off["native"] and off["compute_dtype"] == "stored"
    for prompt in PROMPTS:
        assert off[prompt]["decode_step"] == native[prompt]["decode_step"] == "compiled"
        assert off[prompt]["tokens"] == native[prompt]["tokens"], prompt
        assert len(native[prompt]["tokens"]) > 10
