"""Issue 54 item 4: an imported chat must never lock the app out. Every value of an import
is checked, and a bad one is refused with its field named, importing nothing; a bad value
that is in the database anyway (an older Brisk, sqlite3 by hand) is read as a marked row,
and the chat and the window still open (an infinite decode speed used to crash Qt)."""

import json
import math
import re
import sqlite3

import pytest

from brisk.app.chat_files import export_json, import_json
from brisk.app.store import Store, StoreError
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.api.settings import ChatSettings

GOOD_METRICS = TurnMetrics(
    ttft_s=0.4,
    prompt_tokens=900,
    cached_tokens=400,
    prefill_tps=80.0,
    generated_tokens=3,
    decode_tps=12.5,
    kv_bytes=3 * 2**20,
    finish_reason="stop",
    prefill_method="uniprefill",
    drops=[[7, 500, 250]],
    coverage={"new_tokens": 500, "read_share": 0.5, "layers": [[7, [[0, 250]]]], "skipped": [[250, 500, "later"]]},
    draft_tokens=4,
    accepted_tokens=3,
    sources=["", "draft", "lookup"],
).to_dict()


def export(**changes):
    """A good export (two messages) with `changes` applied: "messages.1.metrics.ttft_s" style keys."""
    data = {
        "format": "brisk-chat",
        "version": 1,
        "title": "a chat",
        "settings": ChatSettings(model="big").to_dict(),
        "messages": [
            {"role": "user", "content": "hi", "finish_reason": None, "metrics": None},
            {"role": "assistant", "content": "yo", "finish_reason": "stop", "metrics": dict(GOOD_METRICS)},
        ],
    }
    for path, value in changes.items():
        *parents, last = path.split(".")
        target = data
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[int(last) if isinstance(target, list) else last] = value
    return data


def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = {
    # the issue's report: a number written as text
    "string number": (
        {"messages.1.metrics.ttft_s": "0.4s"},
        "messages[1].metrics.ttft_s must be a number, not '0.4s'",
    ),
    "NaN": ({"messages.1.metrics.ttft_s": math.nan}, "messages[1].metrics.ttft_s must be a finite number, not nan"),
    "inf": ({"messages.1.metrics.decode_tps": math.inf}, "messages[1].metrics.decode_tps must be a finite number"),
    "huge int": ({"messages.1.metrics.kv_bytes": 10**400}, "messages[1].metrics.kv_bytes must be a whole number"),
    "int past SQLite": ({"messages.1.metrics.prompt_tokens": 2**64}, "prompt_tokens must be a whole number"),
    "negative count": ({"messages.1.metrics.generated_tokens": -3}, "generated_tokens must be a whole number"),
    "negative rate": ({"messages.1.metrics.decode_tps": -5.0}, "decode_tps must be a number from -1 to"),
    "float as count": ({"messages.1.metrics.kv_bytes": 3.5}, "kv_bytes must be a whole number, not 3.5"),
    "object for a number": ({"messages.1.metrics.ttft_s": {"s": 1}}, "ttft_s must be a number, not an object"),
    "list for an object": ({"messages.1.metrics.coverage": [1, 2]}, "metrics.coverage must be an object, not a list"),
    "wrong nested type": (
        {"messages.1.metrics.coverage": {"new_tokens": 5, "layers": [[0, "all"]]}},
        "messages[1].metrics.coverage.layers[0][1] must be a list, not 'all'",
    ),
    "NaN deep in coverage": (
        {"messages.1.metrics.coverage": {"layers": [[0, [[0, math.nan]]]]}},
        "coverage.layers[0][1][0][1] must be a whole number, not nan",
    ),
    "drops as text": ({"messages.1.metrics.drops": "abc"}, "messages[1].metrics.drops must be a list, not 'abc'"),
    "sources of numbers": ({"messages.1.metrics.sources": [1]}, "metrics.sources[0] must be one of"),
    "extra nested too deep": ({"messages.1.metrics.extra": {"a": nested(50)}}, "nests deeper than"),
    "lone surrogate in text": (
        {"messages.0.content": "a\ud800b"},
        "messages[0].content holds '\\ud800' at character 1",
    ),
    "lone surrogate in a title": ({"title": "\udc00"}, "title holds '\\udc00'"),
    "lone surrogate in metrics": ({"messages.1.metrics.kv_check": "\ud83d"}, "metrics.kv_check holds '\\ud83d'"),
    "huge string": (
        {"messages.1.metrics.decode_step": "x" * 200_001},
        "decode_step must be at most 100,000 characters",
    ),
    "unknown role": ({"messages.0.role": "wizard"}, "messages[0].role must be one of ('system', 'user', 'assistant')"),
    "content as a list": ({"messages.0.content": ["hi"]}, "messages[0].content must be text, not a list"),
    "bad finish reason": ({"messages.1.finish_reason": "exploded"}, "messages[1].finish_reason must be one of"),
    "kv_bits of 3": ({"settings.kv_bits": 3}, "the settings are invalid: kv_bits must be 16, 8 or 4 (got 3)"),
    "negative temperature": ({"settings.temperature": -1}, "the settings are invalid: temperature must be >= 0"),
    "model id with ../": ({"settings.model": "../../etc"}, "the settings are invalid: model must be an installed"),
    "draft id with ../": ({"settings.draft": "../x"}, "the settings are invalid: draft must be an installed"),
    "max_tokens past a spin box": ({"settings.max_tokens": 2**40}, "the settings are invalid: max_tokens must be"),
    "messages not a list": ({"messages": {"0": 1}}, "messages must be a list, not an object"),
    "message not an object": ({"messages.0": "hi"}, "messages[0] must be an object, not 'hi'"),
    "newer export version": ({"version": 2}, "version must be 1"),
}


def row_counts(store):
    return [store.db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("conversations", "messages")]


@pytest.mark.parametrize("name", HOSTILE)
def test_each_hostile_import_is_refused_with_its_field_named_and_adds_nothing(tmp_path, name):
    changes, message = HOSTILE[name]
    store = Store(tmp_path / "b.db")
    import_json(store, export())
    before = row_counts(store)
    with pytest.raises(StoreError, match=re.escape(message)) as refused:
        import_json(store, export(**changes))
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300  # one line for the status bar
    assert row_counts(store) == before


def test_a_good_export_imports_whole_and_exports_the_same(tmp_path):
    store = Store(tmp_path / "b.db")
    data = json.loads(json.dumps(export()))
    cid = import_json(store, data)
    again = export_json(store, cid)
    assert again["messages"] == data["messages"] and again["settings"] == data["settings"]


def test_values_this_brisk_does_not_read_are_not_saved(tmp_path):
    store = Store(tmp_path / "b.db")
    cid = import_json(store, export(**{"messages.1.metrics.from_the_future": math.nan, "messages.1.extra": 1}))
    assert "from_the_future" not in store.messages(cid)[1].metrics


# --- the same values already in the database ---------------------------------------------


def answer_metrics(text):
    return f"UPDATE messages SET metrics = '{text}' WHERE role = 'assistant'"


ROW_DAMAGE = {
    "string number": answer_metrics('{"ttft_s": "0.4s"}'),
    "NaN": answer_metrics('{"ttft_s": NaN, "decode_tps": 3.0}'),
    "inf": answer_metrics('{"decode_tps": Infinity}'),
    "NaN speed": answer_metrics('{"prefill_tps": NaN, "decode_tps": 3.0}'),
    "huge int": answer_metrics(f'{{"kv_bytes": {10**400}, "prompt_tokens": 5}}'),
    "digits past Python's limit": answer_metrics(f'{{"kv_bytes": {"9" * 5000}}}'),
    "wrong nested type": answer_metrics('{"coverage": [1, 2]}'),
    "drops as text": answer_metrics('{"prefill_method": "uniprefill", "drops": "abc"}'),
    "a count as text": answer_metrics('{"draft_tokens": 3, "accepted_tokens": "2"}'),
    "lone surrogate": answer_metrics('{"kv_check": "\\ud800"}'),
    "text not UTF-8": "UPDATE messages SET content = CAST(X'6869ff' AS TEXT) WHERE role = 'user'",
    "text as a blob": "UPDATE messages SET content = X'00ff' WHERE role = 'user'",
    "unknown role": "UPDATE messages SET role = 'wizard' WHERE role = 'user'",
    "bad finish reason": "UPDATE messages SET finish_reason = 'exploded' WHERE role = 'assistant'",
    "title as a number": "UPDATE conversations SET title = 42",
    "title not UTF-8": "UPDATE conversations SET title = CAST(X'ff' AS TEXT)",
    "bad settings": (
        "UPDATE conversations SET settings = "
        f'\'{{"kv_bits": 3, "max_tokens": {2**40}, "model": "../x", "temperature": "hot", "top_p": 0.5}}\''
    ),
    "version time as text": "UPDATE messages SET created = 'yesterday'",
}


CHAT_LEVEL = {"title as a number", "title not UTF-8", "bad settings", "version time as text"}


def damaged_chat(path, sql):
    """A chat (question, answer with full metrics, and an earlier answer kept by Regenerate), then `sql`."""
    store = Store(path)
    cid = store.create_conversation("chat", ChatSettings(model="big").to_dict())
    store.add_message(cid, "user", "hi")
    store.add_message(cid, "assistant", "first", finish_reason="stop", metrics=GOOD_METRICS)
    answer = store.regenerate_at(cid, 1)
    store.finish_answer(answer, "second", "stop", GOOD_METRICS)
    store.close()
    db = sqlite3.connect(path)
    db.execute(sql)
    db.commit()
    db.close()
    return cid


@pytest.mark.parametrize("name", ROW_DAMAGE)
def test_a_bad_row_in_the_database_opens_marked_and_the_window_starts(qtbot, make_window, db_path, name):
    from brisk.app.chat_schema import ROLES, metrics_problems, settings_problems

    cid = damaged_chat(db_path, ROW_DAMAGE[name])
    window = make_window()  # opens the newest chat, this one, as every start does
    store, controller = window.store, window.controller
    assert controller.current == cid and len(window.chat_view.messages) == 2
    window.grab()  # paints the dashboard's chart and gauges and the coverage map
    messages = store.messages(cid)
    for m in messages:  # the app only ever sees values it can use
        assert m.role in ROLES and isinstance(m.content, str)
        assert m.metrics is None or metrics_problems(m.metrics) == {}
    conv = store.conversation(cid)
    assert isinstance(conv.title, str) and settings_problems(conv.settings) == {}
    if name in CHAT_LEVEL:  # not one message's damage: the chat opens with what could be read
        assert not any(m.note for m in messages)
        return
    assert store.problems  # reported once, in the startup box
    marked = [m for m in messages if m.note]
    assert len(marked) == 1 and "Could not be read from the chat database" in marked[0].note
    assert window.chat_view.messages[messages.index(marked[0])].toolTip() == marked[0].note
    controller.open(cid)  # opened again later: the status bar says so too
    assert window.statusBar().currentMessage().endswith(marked[0].note)
    # What was read can be exported and imported again: nothing bad travels on.
    import_json(store, json.loads(json.dumps(export_json(store, cid), allow_nan=False)))


def test_bad_settings_in_a_row_are_dropped_one_by_one(tmp_path):
    path = tmp_path / "b.db"
    cid = damaged_chat(path, ROW_DAMAGE["bad settings"])
    settings = Store(path).conversation(cid).settings
    assert settings == {"top_p": 0.5}


def test_a_row_whose_role_or_text_cannot_be_read_is_shown_but_never_sent(qtbot, make_window, engine, db_path):
    from PySide6.QtCore import Qt

    cid = damaged_chat(db_path, "UPDATE messages SET role = 'wizard' WHERE role = 'user'")
    window = make_window()
    assert window.controller.current == cid
    window.composer.edit.setPlainText("and now?")
    qtbot.keyClick(window.composer.edit, Qt.Key_Return)
    assert [(m.role, m.content) for m in engine.commands[-1].messages] == [
        ("assistant", "second"),
        ("user", "and now?"),
    ]


def test_unreadable_import_files_say_why_in_the_status_bar(qtbot, make_window, tmp_path):
    window = make_window()
    chats = len(window.store.conversations())
    files = {
        "digits.json": b'{"format": "brisk-chat", "messages": [], "title": ' + b"9" * 5000 + b"}",
        "deep.json": b"[" * 100_000 + b"]" * 100_000,
        "latin1.json": '{"format": "brisk-chat", "title": "caf\xe9"}'.encode("latin-1"),
    }
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        window.import_json(str(path))
        assert window.statusBar().currentMessage().startswith(f"Cannot import {name}: "), name
    assert len(window.store.conversations()) == chats


def test_metrics_with_fields_missing_read_whole_and_the_window_starts(qtbot, make_window, db_path):
    """An older Brisk's export (or row) may lack fields the dashboard reads together."""
    store = Store(db_path)
    old = export(**{"messages.1.metrics": {"ttft_s": 0.5, "draft_tokens": 3}})
    cid = import_json(store, old)
    store.close()
    window = make_window()
    assert window.controller.current == cid
    window.grab()
    metrics = window.store.messages(cid)[1].metrics
    assert metrics == {**TurnMetrics().to_dict(), "ttft_s": 0.5, "draft_tokens": 3}
    assert window.dashboard.ttft.text() == "0.50 s"
