"""The model manager with a fake engine: commands out, progress and results in."""

from PySide6.QtCore import Qt

from engine.events import DownloadProgressed, EngineErrored
from engine.model_commands import ImportGGUF, InstallBundled, ModelsChanged, PullModel


def test_download_progress_updates_model_manager(qtbot, make_window, engine):
    manager = make_window().show_models()
    manager.repo.setText("owner/some-model")
    qtbot.mouseClick(manager.download_button, Qt.LeftButton)
    assert engine.commands[-1] == PullModel("owner/some-model")
    assert manager.progress.isVisibleTo(manager) and manager.cancel_button.isVisibleTo(manager)
    engine.play(DownloadProgressed("owner/some-model", 250, 1000, "model.safetensors"))
    assert manager.progress.value() == 250 and "model.safetensors" in manager.status.text()
    qtbot.mouseClick(manager.cancel_button, Qt.LeftButton)
    assert engine.stopped == 1
    engine.play(ModelsChanged("Downloaded some-model"))
    assert not manager.progress.isVisibleTo(manager) and manager.status.text() == "Downloaded some-model"


def test_failed_download_updates_model_manager_status(qtbot, make_window, engine):
    manager = make_window().show_models()
    manager.repo.setText("not a repo")
    qtbot.mouseClick(manager.download_button, Qt.LeftButton)
    assert not engine.commands and "owner/name" in manager.status.text()
    manager.repo.setText("owner/missing")
    qtbot.mouseClick(manager.download_button, Qt.LeftButton)
    engine.play(EngineErrored("Repository owner/missing was not found on the hub", "download"))
    assert "not found" in manager.status.text() and not manager.progress.isVisibleTo(manager)


def test_install_and_import_send_commands(qtbot, make_window, engine, tmp_path):
    manager = make_window().show_models()
    manager.install_bundled("gemma-3-270m")
    assert engine.commands[-1] == InstallBundled("gemma-3-270m")
    manager.import_gguf(str(tmp_path / "m.gguf"), "my-model")
    assert engine.commands[-1] == ImportGGUF(str(tmp_path / "m.gguf"), "my-model")
