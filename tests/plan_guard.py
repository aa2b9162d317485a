"""The rule behind the marker `plan_independent`, checked while the marked tests run.

A test file marked `pytestmark = pytest.mark.plan_independent` runs no model and no kernel, so
its tests take the same code path under every kernel plan (kernels/plan.py): .ci/run runs them
once, in its main stage, and leaves them out of the BRISK_KERNELS=off stage. tests/conftest.py
holds every marked test to that, its fixtures' setup and teardown included:

- the kernel plan is never consulted and no native kernel is asked for: every model load asks
  `brisk.kernels.plan.current()`, and every kernel call asks its loader's `status()` (kernels/ctypes_library.py,
  kernels/mlx_extension.py), which keeps its answer, so both are watched;
- no loaded model is handed in (a session fixture built by an earlier test asks no plan then);
- no process is started (what a child process would consult cannot be seen from here);
- the file never names the plan's switches (a test that steers the plan depends on it).
"""

from __future__ import annotations

import subprocess
import traceback
from pathlib import Path

# The shared fixtures that hand a test a model already loaded (tests/conftest.py).
MODEL_FIXTURES = frozenset({"tiny_llama", "tiny_llama_q4"})
PLAN_WORDS = ("BRISK_KERNELS", "brisk.kernels.plan", "from kernels import plan")


def static_problems(path: Path, fixturenames: list[str]) -> list[str]:
    """What the marked test's file and fixtures show before it runs."""
    problems = [f"it is handed the loaded model `{name}`" for name in sorted(MODEL_FIXTURES & set(fixturenames))]
    text = path.read_text(encoding="utf-8")
    problems += [f"its file names `{word}`" for word in PLAN_WORDS if word in text]
    return problems


class Watch:
    """While on: each consultation of the plan, each native-kernel loader asked and each process
    started is recorded (with where it came from); the calls still go through, so what the test
    sees is unchanged."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._undo: list[tuple[object, str, object]] = []

    def _watch(self, owner: object, name: str, what: str) -> None:
        original = getattr(owner, name)

        def watched(*args, **kwargs):
            self.seen.append(f"{what}:\n" + "".join(traceback.format_stack(limit=8)[:-1]))
            return original(*args, **kwargs)

        self._undo.append((owner, name, original))
        setattr(owner, name, watched)

    def start(self) -> None:
        from brisk.kernels import ctypes_library, mlx_extension, plan

        self._watch(plan, "current", "the kernel plan was consulted")
        self._watch(ctypes_library, "status", "the native kernels (ctypes) were asked for")
        self._watch(mlx_extension, "status", "the native kernels (MLX primitives) were asked for")
        popen_init = subprocess.Popen.__init__

        def watched_popen_init(popen, args, *rest, **kwargs):
            self.seen.append(f"a process was started: {args!r}")
            popen_init(popen, args, *rest, **kwargs)

        self._undo.append((subprocess.Popen, "__init__", popen_init))
        subprocess.Popen.__init__ = watched_popen_init  # type: ignore[method-assign]

    def stop(self) -> list[str]:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo = []
        seen, self.seen = self.seen, []
        return seen
