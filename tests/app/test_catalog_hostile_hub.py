"""The model manager's catalogue against a hostile hub and an impatient user: HTML in a hub's
fields stays text in tooltips, Install pressed twice downloads once, and a model that does
not fit this machine asks before it downloads."""

import json

import pytest
from PySide6 import QtGui
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from brisk.engine.host.model_commands import ModelsChanged, PullModel
from tests.app.test_catalog_manager import rows, search, select
from tests.hub_server import HubServer
from tests.tiny_models import make_tiny_model

HTML = "<img src='/etc/passwd'><h1>AWQ</h1>"


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    html = make_tiny_model(root / "acme" / "html-quant")
    config = json.loads((html / "config.json").read_text())
    (html / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": HTML}}))
    make_tiny_model(root / "acme" / "tiny-llama-4bit", quantize=4)
    (root / "acme" / "tiny-llama-4bit" / ".hub.json").write_text(json.dumps({"cardData": {"license": "mit"}}))
    huge = make_tiny_model(root / "acme" / "huge-llama")
    siblings = [{"rfilename": "config.json", "size": 100}, {"rfilename": "model.safetensors", "size": 900 * 10**9}]
    (huge / ".hub.json").write_text(json.dumps({"siblings": siblings, "cardData": {"license": "mit"}}))
    return root


@pytest.fixture
def hub(hub_root, monkeypatch):
    with HubServer(hub_root) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_html_from_the_hub_is_text_in_the_tooltips(qtbot, make_window, hub):
    manager = make_window().show_models()
    search(qtbot, manager, "html-quant")
    assert rows(manager)["acme/html-quant"][2] == HTML  # the cell itself is plain text
    for column in range(manager.results.columnCount()):
        tip = manager.results.item(0, column).toolTip()
        shown = QtGui.QTextDocument()
        shown.setHtml(tip)  # what the tooltip label renders
        assert "<img" not in tip and "<h1>" not in tip
        if column in (2, 5):  # quantization and the support note quote the hub's text
            assert HTML in shown.toPlainText()


def test_install_pressed_twice_downloads_once(qtbot, make_window, engine, hub):
    manager = make_window().show_models()
    search(qtbot, manager, "tiny-llama-4bit")
    select(manager, "acme/tiny-llama-4bit")
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    manager.repo.setText("acme/tiny-llama-4bit")
    qtbot.mouseClick(manager.download_button, Qt.LeftButton)
    assert engine.commands == [PullModel("acme/tiny-llama-4bit")]
    assert manager.status.text() == "acme/tiny-llama-4bit is already being downloaded"
    engine.play(ModelsChanged("Download of acme/tiny-llama-4bit cancelled"))
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)  # over: it may be asked again
    assert engine.commands == [PullModel("acme/tiny-llama-4bit")] * 2


def test_a_model_that_does_not_fit_asks_before_it_downloads(qtbot, make_window, engine, hub, monkeypatch):
    asked, answers = [], [QMessageBox.No, QMessageBox.Yes]
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: asked.append(a[2]) or answers.pop(0)))
    manager = make_window().show_models()
    search(qtbot, manager, "huge-llama")
    assert rows(manager)["acme/huge-llama"][6].startswith("no: 900.00 GB of weights")
    select(manager, "acme/huge-llama")
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    assert not engine.commands and "does not fit this machine" in asked[0] and "900.00 GB" in asked[0]
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    assert engine.commands == [PullModel("acme/huge-llama")]


def test_enter_held_down_on_a_slow_hub_starts_a_bounded_number_of_searches(qtbot, make_window, monkeypatch):
    """The Search button is disabled while a search runs, but Enter in the box was not: each
    press started another thread asking the hub up to 8 things at once."""
    import threading

    from brisk.app.model_operations import MAX_SEARCHES
    from brisk.engine.models.catalog import SearchResult

    answer, asked = threading.Event(), []

    def slow_search(text, **kwargs):
        asked.append(text)
        answer.wait(10)
        return SearchResult(text, "http://hub", [], [])

    monkeypatch.setattr("brisk.engine.models.catalog.search_hub", slow_search)
    manager = make_window().show_models()
    for press in range(20):
        manager.search_box.setText(f"model {press}")
        qtbot.keyClick(manager.search_box, Qt.Key_Return)
    assert len(manager.operations._search_threads) == MAX_SEARCHES
    assert "not answered the earlier searches" in manager.status.text()
    answer.set()
    manager.operations.wait_for_searches()
    qtbot.waitUntil(lambda: manager.search_button.isEnabled(), timeout=10000)
    assert len(asked) == MAX_SEARCHES and "model 2" in manager.results_title.text()


def test_fits_this_machine_shows_without_scrolling_sideways(qtbot, make_window, hub):
    """A long support note widened its column until 'Fits this machine' was off the table's
    right edge at the dialog's own size; long notes wrap and the tooltip holds them whole."""
    manager = make_window().show_models()
    search(qtbot, manager, "acme")  # the html-quant row's note is 80 characters
    table, fits = manager.results, table_columns() - 1
    assert table.columnViewportPosition(fits) + table.columnWidth(fits) <= table.viewport().width()
    assert table.columnWidth(0) >= table.sizeHintForColumn(0)  # ids are never cut
    note = next(m.support_note for m in manager.catalog if m.id == "acme/html-quant")
    tip = QtGui.QTextDocument()
    tip.setHtml(table.item(0, 5).toolTip())
    assert table.item(0, 0).text() == "acme/html-quant" and len(note) > 60 and note in tip.toPlainText()


def table_columns():
    from brisk.app.widgets.model_manager import CATALOG_COLUMNS

    return len(CATALOG_COLUMNS)


def test_the_results_title_says_why_entries_were_left_out(qtbot, make_window, hub_root, monkeypatch):
    """It said '2 malformed entries left out' for a list of a thousand bad ids plus a repo the
    hub could not find, and nowhere said which or why."""
    listing = [{"id": "<b>x</b>"}] * 1000 + [{"id": "acme/gone"}, {"id": "acme/tiny-llama-4bit"}]
    with HubServer(hub_root, replies={"/api/models": json.dumps(listing).encode()}) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        manager = make_window().show_models()
        search(qtbot, manager, "acme")
    title = manager.results_title
    assert title.text().startswith("1 model matching") and "left out (point here for why)" in title.text()
    why = QtGui.QTextDocument()
    why.setHtml(title.toolTip())
    assert "1000 entries without a valid repo id (the first: {'id': '<b>x</b>'})" in why.toPlainText()
    assert "acme/gone: not found" in why.toPlainText() and "<b>" not in title.toolTip()


def test_another_orgs_model_of_the_same_name_is_not_called_installed(qtbot, make_window, engine, hub, tiny_llama_dir):
    """other/tiny-llama-4bit installed takes the local id tiny-llama-4bit: Install on
    acme/tiny-llama-4bit said 'tiny-llama-4bit is already installed', which it is not."""
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    store.install_folder(tiny_llama_dir, model_id="tiny-llama-4bit", source="hf:other/tiny-llama-4bit@abc")
    try:
        manager = make_window().show_models()
        search(qtbot, manager, "tiny-llama-4bit")
        select(manager, "acme/tiny-llama-4bit")
        qtbot.mouseClick(manager.install_button, Qt.LeftButton)
        text = manager.status.text()
        assert text.startswith("Another model is installed as tiny-llama-4bit (from hf:other/tiny-llama-4bit@abc)")
        assert not engine.commands
    finally:
        store.remove("tiny-llama-4bit")
    store.install_folder(tiny_llama_dir, model_id="tiny-llama-4bit", source="hf:acme/tiny-llama-4bit@abc")
    try:
        manager.refresh()
        qtbot.mouseClick(manager.install_button, Qt.LeftButton)
        assert manager.status.text() == "tiny-llama-4bit is already installed" and not engine.commands
    finally:
        store.remove("tiny-llama-4bit")
