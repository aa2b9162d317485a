"""The model manager's catalogue, driven through its real widgets: hub search against the
loopback hub, install from a result, bundled details, licence and removal warnings, errors
in the app's words and never in the chat."""

import json
import os
import socket

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from brisk.engine.host.model_commands import InstallBundled, ModelCommandFailed, PullModel, RemoveModel, app_wording
from tests.hub_server import HubServer
from tests.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    make_tiny_model(root / "acme" / "tiny-llama-4bit", quantize=4)
    (root / "acme" / "tiny-llama-4bit" / ".hub.json").write_text(json.dumps({"cardData": {"license": "mit"}}))
    make_tiny_model(root / "acme" / "tiny-llama-nolicence")
    bert = make_tiny_model(root / "other" / "tiny-bert")
    config = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    return root


@pytest.fixture
def hub(hub_root, monkeypatch):
    with HubServer(hub_root) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def search(qtbot, manager, text):
    manager.search_box.setText(text)
    qtbot.mouseClick(manager.search_button, Qt.LeftButton)
    manager.operations.wait_for_searches()
    qtbot.waitUntil(lambda: manager.search_button.isEnabled(), timeout=10000)


def rows(manager):
    table = manager.results
    return {
        table.item(r, 0).text(): [table.item(r, c).text() for c in range(table.columnCount())]
        for r in range(table.rowCount())
    }


def select(manager, model_id):
    row = next(r for r in range(manager.results.rowCount()) if manager.results.item(r, 0).text() == model_id)
    manager.results.selectRow(row)


def test_search_updates_model_manager_with_details_and_installs_the_choice(qtbot, make_window, engine, hub, tmp_path):
    manager = make_window().show_models()
    search(qtbot, manager, "tiny")
    found = rows(manager)
    assert set(found) == {"acme/tiny-llama-4bit", "acme/tiny-llama-nolicence", "other/tiny-bert"}
    name, size, quantization, licence, context, runs, fits = found["acme/tiny-llama-4bit"]
    assert size.endswith("kB") and quantization == "4-bit MLX, groups of 32" and licence == "mit"
    assert context == "512 tokens" and runs.startswith("yes") and fits.startswith("yes")
    assert found["acme/tiny-llama-nolicence"][3] == "no licence stated"
    assert "3 models matching" in manager.results_title.text()
    manager.resize(1100, 620)
    shot = os.environ.get("BRISK_CATALOG_SCREENSHOT")  # a PNG to look at by hand
    if shot:
        manager.grab().save(shot)
    select(manager, "acme/tiny-llama-4bit")
    assert manager.install_button.isEnabled()
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    assert engine.commands[-1] == PullModel("acme/tiny-llama-4bit")
    assert manager.progress.isVisibleTo(manager)


def test_an_unsupported_result_cannot_be_installed_and_says_why(qtbot, make_window, engine, hub):
    manager = make_window().show_models()
    search(qtbot, manager, "bert")
    select(manager, "other/tiny-bert")
    assert not manager.install_button.isEnabled()
    assert "cannot be installed" in manager.status.text() and "'bert'" in manager.status.text()
    manager.install_result(manager.catalog[0])
    assert not engine.commands


def test_a_model_without_a_licence_asks_before_it_installs(qtbot, make_window, engine, hub, monkeypatch):
    asked = []
    answers = [QMessageBox.No, QMessageBox.Yes]
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: asked.append(a[2]) or answers.pop(0)))
    manager = make_window().show_models()
    search(qtbot, manager, "nolicence")
    select(manager, "acme/tiny-llama-nolicence")
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    assert not engine.commands and "states no licence" in asked[0]
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    assert engine.commands[-1] == PullModel("acme/tiny-llama-nolicence")


def test_offline_search_is_one_line_in_the_manager(qtbot, make_window, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
    manager = make_window().show_models()
    search(qtbot, manager, "tiny")
    text = manager.status.text()
    assert "are you offline" in text and "\n" not in text and "Traceback" not in text
    assert not manager.results.isVisibleTo(manager) or manager.results.rowCount() == 0


def test_install_bundled_lists_size_licence_and_context_then_asks_when_no_licence(
    qtbot, make_window, engine, monkeypatch
):
    asked = []
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: asked.append(a[2]) or QMessageBox.Yes))
    manager = make_window().show_models()
    qtbot.mouseClick(manager.bundled_button, Qt.LeftButton)
    found = rows(manager)
    assert "smollm2-135m-instruct" in found and "qwen2.5-coder-0.5b-instruct" in found
    _, size, quantization, licence, context, runs, _ = found["qwen2.5-coder-0.5b-instruct"]
    assert size == "491 MB" and "Q4_K_M" in quantization and licence == "no licence stated"
    assert context == "32,768 tokens" and runs.startswith("yes")
    assert found["smollm2-135m-instruct"][3] == "Apache-2.0"
    select(manager, "qwen2.5-coder-0.5b-instruct")
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    assert "states no licence" in asked[0] and engine.commands[-1] == InstallBundled("qwen2.5-coder-0.5b-instruct")


def test_model_errors_show_in_the_manager_in_app_words_never_in_the_chat(qtbot, make_window, engine, monkeypatch):
    w = make_window()
    manager = w.show_models()
    manager.repo.setText("owner/model")
    qtbot.mouseClick(manager.download_button, Qt.LeftButton)
    cli_words = "Model 'model' is already installed; remove it first or choose another --id"
    engine.play(ModelCommandFailed(app_wording(cli_words), "error"))
    assert "already installed" in manager.status.text() and "--id" not in manager.status.text()
    assert not w.composer.message.isVisibleTo(w)  # the chat area stays the chat's


def test_removing_a_model_that_chats_use_names_how_many(qtbot, make_window, engine, tiny_llama_dir, monkeypatch):
    from brisk.engine.models.store import ModelStore

    w = make_window()
    for title in ("one", "two"):
        w.controller.store.create_conversation(title, {"model": "doomed"})
    w.controller.store.create_conversation("three", {"model": "other"})
    ModelStore().install_folder(tiny_llama_dir, model_id="doomed", source="test")
    asked = []
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: asked.append(a[2]) or QMessageBox.Yes))
    manager = w.show_models()
    manager.table.selectRow(0)
    qtbot.mouseClick(manager.remove_button, Qt.LeftButton)
    assert "doomed (2 chats)" in asked[0] and engine.commands[-1] == RemoveModel("doomed")
    ModelStore().remove("doomed")


def test_a_search_that_answers_after_the_dialog_is_gone_is_dropped_quietly(qtbot, engine, monkeypatch):
    import threading

    import shiboken6

    from brisk.app.model_operations import ModelOperations

    answer, failures = threading.Event(), []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))

    def slow_search(text, **kwargs):
        answer.wait(10)
        raise CatalogError("Cannot reach the hub: are you offline?")

    from brisk.engine.models.catalog import CatalogError

    monkeypatch.setattr("brisk.engine.models.catalog.search_hub", slow_search)
    operations = ModelOperations(engine)
    operations.search("tiny")
    threads = list(operations._search_threads)
    shiboken6.delete(operations)  # the dialog closed while the hub was still answering
    answer.set()
    for thread in threads:
        thread.join(10)
    assert not failures


def test_the_fit_follows_the_open_chats_kv_setting(qtbot, make_window, hub):
    w = make_window()
    manager = w.show_models()
    w.settings_panel.kv_bits.setCurrentIndex(w.settings_panel.kv_bits.findData("K8/V4"))
    search(qtbot, manager, "tiny-llama-4bit")
    assert "K8/V4 KV" in rows(manager)["acme/tiny-llama-4bit"][6]
    w.settings_panel.kv_bits.setCurrentIndex(w.settings_panel.kv_bits.findData("16"))
    search(qtbot, manager, "tiny-llama-4bit")
    assert "16-bit KV" in rows(manager)["acme/tiny-llama-4bit"][6]
