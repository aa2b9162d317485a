"""`brisk serve` through the official `openai` client, against a live server on loopback
with a tiny model: answers equal the engine's own, controls are honoured and reported,
bad input gets OpenAI's error shape and the server keeps serving."""

import gc
import json
import socket
import threading
import time
import tracemalloc

import httpx2 as httpx  # the HTTP client the openai package itself uses
import pytest

openai = pytest.importorskip("openai", reason="the server tests drive it with the openai client (the test extra)")
uvicorn = pytest.importorskip("uvicorn", reason="brisk serve runs on uvicorn (a dependency)")

from brisk.engine.api.conversation import Message  # noqa: E402
from brisk.engine.api.session import Session  # noqa: E402
from brisk.engine.api.settings import ChatSettings  # noqa: E402
from brisk.engine.host.serve.app import Server  # noqa: E402
from brisk.engine.host.serve.local import LocalServer  # noqa: E402
from brisk.engine.host.serve.scheduler import EngineQueue  # noqa: E402

# It runs a model only to have something to answer: what it checks (HTTP handling around a model) no kernel
# plan changes, so CI runs it once (the main stage).
pytestmark = pytest.mark.plan_agnostic


class Live(LocalServer):
    def client(self, key="unused") -> "openai.OpenAI":
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def tiny_home(tiny_llama_dir):
    from brisk.engine.models.store import ModelStore

    store = ModelStore()  # tests/conftest.py points BRISK_HOME at a temporary folder
    if not store.has("tiny"):
        store.install_folder(tiny_llama_dir, model_id="tiny", source="test")
    return store


@pytest.fixture(scope="module")
def served(tiny_home):
    queue = EngineQueue()
    live = Live(Server(queue, default_model="tiny").app())
    live.queue = queue
    yield live
    live.stop()
    queue.close()


def engine_answer(tiny_home, text, **settings):
    from brisk.engine.models.loader import load_model

    session = Session(load_model("tiny", store=tiny_home), ChatSettings(model="tiny", **settings))
    finished = [e for e in session.answer([Message("user", text)])][-1]
    return finished.text


def raw(live, path, body, *, headers=None):
    return httpx.post(
        f"{live.url}{path}",
        content=body if isinstance(body, bytes) else json.dumps(body),
        headers={"Content-Type": "application/json", **(headers or {})},
        timeout=120,
    )


def test_a_chat_answer_is_the_engines_own_with_usage_and_metrics(served, tiny_home):
    client = served.client()
    got = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "The quick brown fox"}], max_tokens=12, temperature=0
    )
    answer, body = got.parse(), got.http_response.json()
    assert answer.choices[0].message.content == engine_answer(
        tiny_home, "The quick brown fox", max_tokens=12, temperature=0
    )
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.object == "chat.completion"
    assert answer.usage.completion_tokens == body["brisk"]["metrics"]["generated_tokens"] > 0
    assert answer.usage.prompt_tokens == body["brisk"]["metrics"]["prompt_tokens"] > 0
    assert body["brisk"]["metrics"]["ttft_s"] > 0 and "prefill_route" in body["brisk"]["metrics"]


def test_streaming_sends_the_same_text_and_usage_last(served):
    client = served.client()
    whole = (
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Once upon"}], max_tokens=10, temperature=0
        )
        .choices[0]
        .message.content
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Once upon"}],
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c for c in chunks if c.choices and c.choices[0].finish_reason]  # a finishing chunk
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_completions_read_the_prompt_as_is(served, tiny_home):
    got = served.client().completions.create(model="tiny", prompt="abc def", max_tokens=8, temperature=0)
    assert got.object == "text_completion"
    assert got.choices[0].text == engine_answer(tiny_home, "abc def", max_tokens=8, temperature=0, chat_template=False)


def test_models_lists_what_is_installed_and_health_the_queue(served):
    assert "tiny" in [m.id for m in served.client().models.list()]
    health = httpx.get(f"{served.url}/health").json()
    assert health["status"] == "ok" and {"queued", "served", "cached_bytes", "cache_limit_bytes"} <= set(health)


def test_brisk_controls_are_honoured_and_reported(served):
    got = served.client().chat.completions.with_raw_response.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell me"}],
        max_tokens=6,
        temperature=0,
        extra_body={"brisk": {"k_bits": 8, "spec_decode": "off", "prefill": "uniprefill"}},
    )
    brisk = got.http_response.json()["brisk"]
    assert brisk["controls"] == {"k_bits": 8, "spec_decode": "off", "prefill": "uniprefill"}
    assert brisk["metrics"]["k_bits"] == 8 and brisk["metrics"]["v_bits"] == 16
    assert brisk["metrics"]["spec_decode"].startswith("off")
    assert brisk["metrics"]["prefill_route"]  # what the router did, and why


def test_a_growing_conversation_reuses_the_prompt_cache(served):
    client = served.client()
    first = [{"role": "user", "content": "Remember the number seven, please."}]
    answer = client.chat.completions.create(model="tiny", messages=first, max_tokens=6, temperature=0)
    follow = first + [
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "Which number?"},
    ]
    again = client.chat.completions.create(model="tiny", messages=follow, max_tokens=6, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_a_stop_sequence_ends_the_answer_before_it(served):
    client = served.client()
    messages = [{"role": "user", "content": "The quick brown fox"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    text = whole.choices[0].message.content
    if len(text) < 6:
        pytest.skip(f"the tiny model's answer is too short to cut: {text!r}")
    stop = text[3:6]
    cut = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "body, status, said",
    [
        (b"{not json", 400, "not valid JSON"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools_please": 1}, 400, "tools_please"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
        ({"model": "tiny", "messages": "hi"}, 400, "messages must be a non-empty list"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n must be 1"),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "brisk": {"kv_bits": 5}},
            400,
            "kv_bits must be 16, 8 or 4",
        ),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "brisk": {"v_bits": 4}},
            400,
            "does not divide this model's head dimension",
        ),  # the engine's own refusal, passed on
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "brisk": {"warp": 9}},
            400,
            "Unknown brisk control",
        ),
        ({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, 404, "does not exist"),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "brisk": {"draft": "nope"}},
            404,
            "'nope' does not exist",
        ),
        ({"model": "tiny", "messages": [{"role": "user", "content": "word " * 2000}]}, 400, "holds at most 512"),
        (b"x" * (9 << 20), 413, "larger than"),
    ],
)
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(served, body, status, said):
    response = raw(served, "/v1/chat/completions", body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert said in error["message"] and {"type", "param", "code"} <= set(error)
    ok = served.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert ok.choices[0].message.content is not None


def test_the_context_overflow_says_so_in_openais_code(served):
    response = raw(
        served,
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "word " * 2000}], "stream": True},
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"


# Python heap a request may leave behind: ~24 KiB measured (the slot and session a new
# conversation keeps, bounded by the cache's bytes); a leaked turn, answer or event list adds more.
PER_REQUEST_HEAP = 64 << 10


def _an_answer_that_runs_to_max_tokens(served, max_tokens=480):
    """A request body (seeded, no speculation) whose answer runs to max_tokens: an
    end-of-sequence token sampled early would finish a request before its client leaves (the
    tiny model's 384-token vocabulary makes that likely over hundreds of tokens)."""
    for seed in range(20):
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Go on"}],
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "seed": seed,
            "brisk": {"spec_decode": "off"},
        }
        whole = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=300).json()  # a hang guard
        if whole["choices"][0]["finish_reason"] == "length":
            return body
    pytest.fail("no seed ran the tiny model to max_tokens")


@pytest.fixture  # closed after each test: its engine thread then holds no last job (the leak test counts them)
def held(tiny_home):
    """A server whose engine (the real worker) holds an answer, once armed, after its first
    visible text until the request is cancelled: the answer cannot finish before the server
    notices its client left, however loaded the machine (a fast answer once finished first,
    and "cancelled" was never counted). Only the hang guard lets a server that never notices
    go on."""
    from brisk.engine.accel.speculative.costs_file import StoredPairCosts
    from brisk.engine.api.events import TokenEmitted
    from brisk.engine.host.worker import EngineWorker

    worker = EngineWorker(pair_costs=StoredPairCosts())
    armed = threading.Event()

    def execute(command, cancel, deliver):
        for event in worker.handle(command, cancel):
            deliver(event)
            token = getattr(event, "event", event)
            if armed.is_set() and isinstance(token, TokenEmitted) and token.text:  # some tokens show nothing yet
                armed.clear()
                cancel.wait(HANG_GUARD_S)

    queue = EngineQueue(execute=execute)
    live = Live(Server(queue, default_model="tiny").app())
    live.queue, live.hold_next_answer = queue, armed.set
    yield live
    live.stop()
    queue.close()


HANG_GUARD_S = 120


def test_a_client_that_disconnects_cancels_its_request(served, held):
    """The same body runs to max_tokens when its client waits, so "cancelled" means it stopped
    short (a wall-clock bound here failed on a loaded machine)."""
    body = _an_answer_that_runs_to_max_tokens(served)
    held.hold_next_answer()
    served_before = held.queue.stats()["served"]
    cancelled_before = held.queue.stats()["finished"].get("cancelled", 0)
    with httpx.stream("POST", f"{held.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as response:
        for _ in response.iter_lines():
            break  # one event, then hang up
    _wait_for(lambda: held.queue.stats()["served"] > served_before and not held.queue.stats()["running"])
    assert held.queue.stats()["finished"]["cancelled"] == cancelled_before + 1
    quick = held.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert quick.choices


def test_a_client_that_stops_waiting_for_a_whole_answer_cancels_it(served, held):
    """Non-streaming: the server notices the closed connection while nothing is sent to it. The
    same body runs to max_tokens when its client waits, so "cancelled" means it stopped short."""
    body = _an_answer_that_runs_to_max_tokens(served)
    held.hold_next_answer()
    before = held.queue.stats()
    payload = json.dumps(body).encode()
    with socket.create_connection(held.sock.getsockname()[:2]) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        _wait_for(lambda: held.queue.stats()["running"] or held.queue.stats()["served"] > before["served"])
    # the client has gone; the request ends one way or the other
    _wait_for(lambda: held.queue.stats()["served"] > before["served"])
    assert held.queue.stats()["finished"]["cancelled"] == before["finished"].get("cancelled", 0) + 1


def _wait_for(condition, hang_guard_s: float = 120) -> None:
    """Polls `condition`; the guard only keeps a broken server from hanging the tests."""
    deadline = time.monotonic() + hang_guard_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("gave up waiting (the hang guard)")
        time.sleep(0.01)


def _python_heap() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _alive(kind: type) -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is kind)


def test_fifty_sequential_and_eight_concurrent_clients_without_error_or_leak(served):
    """Leaks as counts, not RSS (which moves with the allocator and the machine's load): no
    request's objects outlive it, and the Python heap grows by no more per request than what
    the server keeps on purpose (each new conversation's slot and session, bounded by bytes)."""
    from brisk.engine.host.serve.app import Turn
    from brisk.engine.host.serve.scheduler import Job

    client = served.client()

    def ask(i):
        got = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"Request {i}"}], max_tokens=4, temperature=0
        )
        return got.choices[0].message.content is not None

    for i in range(10):  # warm up: caches, allocator pools, the session LRU
        ask(i)
    tracemalloc.start()
    try:
        before = _python_heap()
        assert all(ask(i) for i in range(50))
        results = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(all(ask(f"{i}-{j}") for j in range(4))))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        grown = _python_heap() - before
    finally:
        tracemalloc.stop()
    assert results == [True] * 8
    # The engine thread's loop variable holds the last job (and its turn) until the next arrives.
    assert _alive(Turn) <= 1 and _alive(Job) <= 1
    assert grown < 82 * PER_REQUEST_HEAP, f"the Python heap grew {grown:,} bytes over 82 requests"


def test_an_api_key_is_required_when_set(tiny_home):
    queue = EngineQueue()
    live = Live(Server(queue, default_model="tiny", api_key="sesame").app())
    try:
        with pytest.raises(openai.AuthenticationError):
            live.client("wrong").models.list()
        assert "tiny" in [m.id for m in live.client("sesame").models.list()]
    finally:
        live.stop()
        queue.close()


def test_binding_beyond_loopback_needs_an_api_key():
    import argparse

    from brisk.engine.api.errors import BriskError
    from brisk.engine.host.serve.cli import check_binding

    check_binding(argparse.Namespace(host="127.0.0.1", port=8088, api_key=None))
    check_binding(argparse.Namespace(host="0.0.0.0", port=8088, api_key="k"))
    with pytest.raises(BriskError, match="--api-key"):
        check_binding(argparse.Namespace(host="0.0.0.0", port=8088, api_key=None))


@pytest.mark.real_model
def test_smollm2_answers_paris_through_the_openai_client(real_store):
    from brisk.engine.host.worker import EngineWorker
    from brisk.engine.models.loader import load_model
    from tests.conftest import REAL_MODEL

    queue = EngineQueue(EngineWorker(load=lambda model_id: load_model(model_id, store=real_store)))
    live = Live(Server(queue, default_model=REAL_MODEL, known_model=real_store.has).app())
    try:
        answer = live.client().chat.completions.create(
            model=REAL_MODEL,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16,
            temperature=0,
        )
    finally:
        live.stop()
        queue.close()
    assert "Paris" in answer.choices[0].message.content
