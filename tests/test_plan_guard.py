"""The guard behind `plan_independent` (tests/plan_guard.py) catches what would make a marked
file depend on the kernel plan, and changes nothing for the code it watches."""

import subprocess
import sys

from brisk.kernels import plan
from tests.plan_guard import MODEL_FIXTURES, Watch, static_problems


def test_consulting_the_plan_is_seen_and_still_answered():
    watch = Watch()
    watch.start()
    try:
        answered = plan.current()
    finally:
        seen = watch.stop()
    assert answered is plan.current()  # the same plan as unwatched, and the original is back
    assert "kernel plan was consulted" in seen[0] and "test_plan_guard.py" in seen[0]  # (a first plan runs uname)


def test_asking_for_a_kernel_already_loaded_is_seen():
    from brisk.kernels import ctypes_library, mlx_extension

    ctypes_library.status(), mlx_extension.status()  # loaded (or refused) before: the loaders keep it
    watch = Watch()
    watch.start()
    try:
        ctypes_library.load(), mlx_extension.load()
    finally:
        seen = watch.stop()
    assert [line.split(":")[0] for line in seen] == [
        "the native kernels (ctypes) were asked for",
        "the native kernels (MLX primitives) were asked for",
    ]


def test_loading_a_model_is_seen(tiny_llama_dir):
    from brisk.engine.models.loader import load_folder

    watch = Watch()
    watch.start()
    try:
        load_folder(tiny_llama_dir, model_id="tiny-llama")
    finally:
        seen = watch.stop()
    assert any("kernel plan was consulted" in line for line in seen)


def test_starting_a_process_is_seen():
    unwatched, watch = subprocess.Popen.__init__, Watch()
    watch.start()
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    finally:
        seen = watch.stop()
    assert subprocess.Popen.__init__ is unwatched
    assert seen == [f"a process was started: {[sys.executable, '-c', 'pass']!r}"]


def test_model_fixtures_and_plan_switches_show_before_the_test_runs(tmp_path):
    steering = tmp_path / "test_x.py"
    steering.write_text("import os\nos.environ['BRISK_KERNELS'] = 'off'\n")
    problems = static_problems(steering, ["tmp_path", "tiny_llama"])
    assert problems == ["it is handed the loaded model `tiny_llama`", "its file names `BRISK_KERNELS`"]
    plain = tmp_path / "test_y.py"
    plain.write_text("def test_sum():\n    assert sum([1]) == 1\n")
    assert static_problems(plain, ["tmp_path"]) == []
    assert {"tiny_llama", "tiny_llama_q4"} == MODEL_FIXTURES


pytest_plugins = ["pytester"]

MARKED = """
import pytest

pytestmark = pytest.mark.plan_independent


def test_pure():
    assert sorted([2, 1]) == [1, 2]


def test_loads_a_model(tiny_llama_dir):
    from brisk.engine.models.loader import load_folder

    load_folder(tiny_llama_dir, model_id="tiny-llama")


def test_is_handed_one(tiny_llama):
    pass
"""


def test_a_marked_test_that_loads_a_model_or_is_handed_one_fails(pytester):
    """The hooks in tests/conftest.py, run on a marked file: the pure test passes, the others fail."""
    pytester.makeconftest(
        "from tests.conftest import pytest_runtest_setup, pytest_runtest_teardown, tiny_llama, tiny_llama_dir"
    )
    pytester.makeini("[pytest]\nmarkers =\n    plan_independent: x\n")
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:pytest-qt")
    result.assert_outcomes(passed=2, errors=2)  # test_loads_a_model passes its call, errs in teardown
    result.stdout.fnmatch_lines(["*marked plan_independent, but it is handed the loaded model `tiny_llama`*"])
    result.stdout.fnmatch_lines(["*marked plan_independent, but the kernel plan was consulted*"])
