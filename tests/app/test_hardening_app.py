"""The app under hostile conditions (issue 14): a save that fails mid-answer loses nothing
and leaves the window usable; Stop before the engine picks a turn up means it never runs."""

import dataclasses
import threading

from brisk.engine.api.conversation import Message
from brisk.engine.api.events import TokenEmitted, TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.api.session import CancelToken
from brisk.engine.host.worker import Answer, ConversationEvent


def fill_disk(store):
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")


def send(window, text):
    window.composer.edit.setPlainText(text)
    window.composer.send_button.click()


def test_disk_full_while_streaming_keeps_the_answer_and_the_window_usable(qtbot, make_window, engine, monkeypatch):
    monkeypatch.setattr("brisk.app.chat_turns.SAVE_INTERVAL_S", 0.0)
    w = make_window()
    send(w, "hi")
    cid = w.controller.current
    answer_id = w.store.messages(cid)[-1].id
    fill_disk(w.store)
    big = "word " * 40_000  # more than the full database can take
    engine.play(
        ConversationEvent(cid, TokenEmitted(big, 1)),
        ConversationEvent(cid, TurnFinished(big, [1], TurnMetrics(finish_reason="stop"))),
    )
    assert "disk is full" in w.statusBar().currentMessage()
    assert not w.controller.busy  # Send works again
    assert w.controller.unsaved[answer_id][0] == big  # kept in memory
    assert w.chat_view.messages[-1].text.startswith("word word")
    w.store.db.execute("PRAGMA max_page_count = 1073741823")  # space freed
    w.controller.retry_unsaved()
    assert w.controller.unsaved == {} and w.store.messages(cid)[-1].content == big
    send(w, "and another")
    assert isinstance(engine.commands[-1], Answer) and engine.commands[-1].messages[-1].content == "and another"


def test_a_refused_user_message_stays_in_the_box(qtbot, make_window, engine):
    w = make_window()
    fill_disk(w.store)
    # 300,000 characters with no break, far more than the full database's free pages take (one
    # unbreakable run: before app/widgets/text_wrap.py, Qt spent ~65 CPU-s laying it out).
    big = "x" * 300_000
    send(w, big)
    assert w.composer.edit.toPlainText() == big
    assert "disk is full" in w.composer.message.text()
    assert not [c for c in engine.commands if isinstance(c, Answer)]
    assert not w.controller.busy


class SlowWorker:
    """Blocks on its first command so a second one waits in the queue."""

    def __init__(self):
        self.release = threading.Event()
        self.started = []

    def handle(self, command, cancel: CancelToken):
        self.started.append((command, cancel.cancelled))
        if len(self.started) == 1:
            self.release.wait(5)
        if cancel.cancelled:
            yield ("cancelled", command)
            return
        yield ("ran", command)


def test_stop_before_the_engine_picks_a_job_up_means_it_never_runs(qtbot):
    from brisk.app.engine_thread import EngineThread

    worker = SlowWorker()
    thread = EngineThread(worker)
    events = []
    thread.event.connect(events.append)
    thread.submit("first")
    second = thread.submit("second")
    qtbot.waitUntil(lambda: len(worker.started) == 1)
    thread.stop()  # the user presses Stop while the second job still waits
    assert second.cancelled
    worker.release.set()
    qtbot.waitUntil(lambda: len(events) == 2, timeout=5000)
    assert events == [("cancelled", "first"), ("cancelled", "second")]
    assert worker.started[1] == ("second", True)
    third = thread.submit("third")  # a later job has its own, unset flag
    qtbot.waitUntil(lambda: len(events) == 3, timeout=5000)
    assert events[-1] == ("ran", "third") and not third.cancelled
    thread.shutdown()


class CountingModel:
    """The model, counting its forward passes: the work a turn that started does."""

    def __init__(self, model):
        self.model, self.passes = model, 0

    def __call__(self, *args, **kwargs):
        self.passes += 1
        return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_a_worker_never_starts_a_turn_cancelled_before_it(tiny_llama):
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.host.worker import EngineWorker

    model = CountingModel(tiny_llama.model)
    loads = []
    worker = EngineWorker(lambda model_id: loads.append(model_id) or dataclasses.replace(tiny_llama, model=model))
    cancel = CancelToken()
    cancel.cancel()
    command = Answer(3, ChatSettings(model="tiny-llama", max_tokens=64), [Message("user", "hi")])
    out = list(worker.handle(command, cancel))
    assert loads == [] and model.passes == 0  # the work a started turn does, counted: no load, no forward pass
    (event,) = out
    assert event.conversation_id == 3 and event.event.metrics.finish_reason == "cancelled"
    runs = dataclasses.replace(command, settings=ChatSettings(model="tiny-llama", max_tokens=2))
    list(worker.handle(runs, CancelToken()))
    assert loads == ["tiny-llama"] and model.passes > 0  # the counts do see a turn that runs


def test_esc_stops_only_the_chats_answer_and_cancel_only_the_download(qtbot, make_window, engine):
    from brisk.engine.host.model_commands import PullModel

    w = make_window()
    manager = w.show_models()
    manager.repo.setText("owner/model")
    manager.download_button.click()
    send(w, "hi")
    w.controller.stop()  # Esc
    assert [type(c).__name__ for c in engine.cancelled] == ["Answer"]
    manager.cancel_button.click()
    assert engine.cancelled[-1] == PullModel("owner/model") and len(engine.cancelled) == 2


def test_every_event_is_also_emitted_with_the_id_of_the_job_that_caused_it(qtbot):
    from brisk.app.engine_thread import EngineThread

    class Echo:
        def handle(self, command, cancel):
            yield f"{command} started"
            yield f"{command} done"

    thread = EngineThread(Echo())
    seen = []
    thread.job_event.connect(lambda job_id, event: seen.append((job_id, event)))
    first, second = thread.submit("a"), thread.submit("b")
    qtbot.waitUntil(lambda: len(seen) == 4, timeout=5000)
    assert seen == [(first.id, "a started"), (first.id, "a done"), (second.id, "b started"), (second.id, "b done")]
    assert first.id != second.id
    thread.shutdown()


APP_EXIT_AFTER_A_COMPILED_TURN = """
import threading
from brisk.app.engine_thread import EngineThread
import mlx.core as mx

double = mx.compile(lambda x: x * 2 + 1)

class CompiledWorker:  # runs a compiled function, as the decode step does
    def handle(self, command, cancel):
        yield float(mx.sum(double(mx.ones((4,)))).item())

thread = EngineThread(CompiledWorker())
events, done = [], threading.Event()
thread.submit("turn", on_event=events.append, on_done=done.set)
assert done.wait(30) and events == [12.0], events
thread.shutdown(30)
"""


def test_the_app_quits_cleanly_after_its_engine_thread_ran_a_compiled_step():
    """Quitting joined the engine thread, then exited while MLX's per-thread compile cache
    was still being destroyed on it: the process aborted about 4 times in 10."""
    import subprocess
    import sys

    for _ in range(6):
        done = subprocess.run([sys.executable, "-c", APP_EXIT_AFTER_A_COMPILED_TURN], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-400:]
