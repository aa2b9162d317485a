"""`brisk serve` against hostile request bodies and about its prompt caches (issue 54, items
11 and 13): every malformed id, lone surrogate and runaway nesting is a 400 in OpenAI's
shape (never a 500 with a traceback), and what the server reports about reused
conversations and cached bytes is what its worker really holds."""

import json
import logging

import pytest

pytest.importorskip("openai", reason="the server tests drive it with the openai client (the test extra)")
pytest.importorskip("uvicorn", reason="brisk serve runs on uvicorn (a dependency)")

import httpx2 as httpx  # noqa: E402

from brisk.engine.api.conversation import Message  # noqa: E402
from brisk.engine.api.metrics import kv_bytes_allocated  # noqa: E402
from brisk.engine.api.session import Session  # noqa: E402
from brisk.engine.api.settings import ChatSettings  # noqa: E402
from brisk.engine.host.serve.app import Server  # noqa: E402
from brisk.engine.host.serve.scheduler import EngineQueue  # noqa: E402
from brisk.engine.host.worker import EngineWorker  # noqa: E402
from tests.engine.test_serve import Live, served, tiny_home  # noqa: E402, F401  (fixtures)

# It runs a model only to have something to answer: what it checks (HTTP handling around a model) no kernel
# plan changes, so CI runs it once (the main stage).
pytestmark = pytest.mark.plan_agnostic

HI = [{"role": "user", "content": "hi"}]
PATIENCE_S = 600  # a first request loads the model (and tries to build kernels) on a busy machine


def post(live, body: bytes):
    return httpx.post(
        f"{live.url}/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=PATIENCE_S,
    )


BAD_IDS = ["../../etc", "UPPER", "a" * 200, "tiny\n"]


def _escaped(body: dict, *, lone: str) -> bytes:
    """The body as JSON with `lone`'s placeholder turned into a \\ud800 escape: JSON allows
    it, Python's json reads it as a lone surrogate, and no UTF-8 encoder can write it."""
    return json.dumps(body).replace(lone, "\\ud800").encode()


HOSTILE = [
    *[
        pytest.param(json.dumps({"model": m, "messages": HI}).encode(), "model", id=f"model-{m[:12]!r}")
        for m in BAD_IDS
    ],
    *[
        pytest.param(
            json.dumps({"model": "tiny", "messages": HI, "brisk": {"draft": m}}).encode(),
            "brisk.draft",
            id=f"draft-{m[:12]!r}",
        )
        for m in BAD_IDS
    ],
    pytest.param(b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None, id="nested-100k"),
    pytest.param(
        _escaped({"model": "tiny", "messages": [{"role": "user", "content": "aLONEb"}]}, lone="LONE"),
        "messages[0].content",
        id="surrogate-content",
    ),
    pytest.param(
        _escaped({"model": "tiny", "messages": HI, "stop": ["LONE"]}, lone="LONE"), "stop[0]", id="surrogate-stop"
    ),
    pytest.param(_escaped({"model": "tiLONEny", "messages": HI}, lone="LONE"), "model", id="surrogate-model"),
    pytest.param(
        _escaped({"model": "tiny", "messages": HI, "brisk": {"draft": "dLONE"}}, lone="LONE"),
        "brisk.draft",
        id="surrogate-draft",
    ),
    pytest.param(  # checked even where max_completion_tokens wins (it was ignored, a 200)
        json.dumps({"model": "tiny", "messages": HI, "max_completion_tokens": 2, "max_tokens": -5}).encode(),
        "max_tokens",
        id="max-tokens-negative-beside-max-completion-tokens",
    ),
    *[
        pytest.param(
            json.dumps({"model": "tiny", "messages": HI, "stream_options": value}).encode(),
            "stream_options",
            id=f"stream-options-{value!r}",
        )
        for value in ({"include_usage": "no"}, [])
    ],
    *[  # a list or object where a name is expected: looked up in a dict, it raised TypeError (a 500)
        pytest.param(
            json.dumps({"model": "tiny", "messages": HI, "brisk": {"prefill": value}}).encode(),
            "brisk.prefill",
            id=f"prefill-{type(value).__name__}",
        )
        for value in (["auto"], {}, 3)
    ],
    pytest.param(  # a field's name: echoed in the error, it had to be escaped to be sent at all
        _escaped({"model": "tiny", "messages": HI, "LONEx": 1}, lone="LONE"),
        "['\\ud800x']",
        id="surrogate-key",
    ),
]


@pytest.mark.parametrize("body, param", HOSTILE)
def test_hostile_input_is_a_400_in_openais_shape_and_the_next_request_is_answered(served, body, param):  # noqa: F811
    response = post(served, body)
    assert response.status_code == 400, response.text[:300]
    assert "Traceback" not in response.text and 'File "' not in response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert "\n" not in error["message"] and len(error["message"]) < 300  # one line, not the input echoed back
    if param is not None:
        assert error["param"] == param
    # A surrogate pair is one character (U+1F600), not a lone surrogate: it is answered.
    good = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi PAIR"}], "max_tokens": 2})
    ok = post(served, good.replace("PAIR", "\\ud83d\\ude00").encode())
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


# --- the prompt caches: what is reported is what the worker holds ---------------------------


@pytest.fixture()
def own_server(tiny_home):  # noqa: F811
    """A server whose worker the test can look into; `cache_bytes` set through `start`."""
    from brisk.engine.models.loader import load_model

    made = []

    def start(cache_bytes=None):
        worker = EngineWorker(load=lambda model_id: load_model(model_id, store=tiny_home))
        queue = EngineQueue(worker) if cache_bytes is None else EngineQueue(worker, cache_bytes=cache_bytes)
        live = Live(Server(queue, default_model="tiny").app())
        live.queue, live.worker = queue, worker
        made.append(live)
        return live

    yield start
    for live in made:
        live.stop()
        live.queue.close()


def real_sessions(worker: EngineWorker) -> dict[int, int]:
    """The server's sessions (negative ids) in the worker, with the bytes their caches reserve."""
    return {
        cid: sum(
            kv_bytes_allocated(cache.layers)
            for cache in [s.cache] + ([s.pair.cache] if s.pair is not None else [])
            if cache.layers is not None
        )
        for cid, s in worker._sessions.items()
        if cid < 0
    }


def ask(live, messages, **extra) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0, **extra}
    response = post(live, json.dumps(body).encode())
    assert response.status_code == 200, response.text[:300]
    return response.json()


def health(live) -> dict:
    return httpx.get(f"{live.url}/health").json()


def test_a_conversation_continued_after_others_reuses_its_cache_as_reported(own_server, tiny_home):  # noqa: F811
    from brisk.engine.models.loader import load_model

    live = own_server()
    first = [{"role": "user", "content": "Remember the number seven, please."}]
    answer = ask(live, first)["choices"][0]["message"]["content"]
    for i in range(5):  # more conversations than the worker once kept (4): the first's must survive
        ask(live, [{"role": "user", "content": f"An unrelated question {i}"}])
    follow = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Which number?"}]
    again = ask(live, follow)

    # The same two turns on one engine session: the tokens a kept cache really reuses.
    reference = Session(load_model("tiny", store=tiny_home), ChatSettings(model="tiny", max_tokens=6, temperature=0))
    said = [e for e in reference.answer([Message("user", first[0]["content"])])][-1].text
    assert said == answer
    turns = [Message(m["role"], m["content"]) for m in follow]
    reused = [e for e in reference.answer(turns)][-1].metrics.cached_tokens

    assert again["brisk"]["prompt_cache"]["reused_conversation"] is True
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == reused > 0

    sessions, report = real_sessions(live.worker), health(live)
    assert report["cached_conversations"] == len(sessions) == 6
    assert report["cached_bytes"] == sum(sessions.values()) > 0


def test_conversations_that_differ_before_their_messages_never_share_or_overwrite_a_cache(own_server):
    """Slots were matched on the messages alone: two system prompts, or a chat and a raw
    completion of the same text, were reported as reused with 0 tokens cached, each wiping
    the other's cache."""
    live = own_server()
    user = [{"role": "user", "content": "Tell me about the river."}]
    sys_a = [{"role": "system", "content": "You are A."}, *user]
    sys_b = [{"role": "system", "content": "You are B."}, *user]
    ask(live, sys_a)
    other = ask(live, sys_b)
    assert other["brisk"]["prompt_cache"]["reused_conversation"] is False
    again = ask(live, sys_a)  # A's cache survived B
    assert again["brisk"]["prompt_cache"]["reused_conversation"] is True
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    raw = httpx.post(
        f"{live.url}/v1/completions",
        json={"model": "tiny", "prompt": "Tell me about the river.", "max_tokens": 4, "temperature": 0},
    ).json()
    assert raw["brisk"]["prompt_cache"]["reused_conversation"] is False


def test_cache_bytes_bounds_the_sessions_the_worker_really_keeps(own_server):
    probe = own_server()
    ask(probe, [{"role": "user", "content": "How large is one?"}])
    (one,) = real_sessions(probe.worker).values()
    budget = one * 3 // 2  # room for one conversation's cache, not two

    live = own_server(cache_bytes=budget)
    for i in range(3):
        ask(live, [{"role": "user", "content": f"Question number {i}"}])
        sessions, report = real_sessions(live.worker), health(live)
        assert len(sessions) == 1  # the older ones were forgotten by the worker, not just unlisted
        assert report["cached_conversations"] == len(sessions)
        assert report["cached_bytes"] == sum(sessions.values()) <= budget == report["cache_limit_bytes"]

    tight = own_server(cache_bytes=one - 1)  # smaller than any one cache: nothing is kept
    ask(tight, [{"role": "user", "content": "Too big to keep"}])
    assert real_sessions(tight.worker) == {} and health(tight)["cached_bytes"] == 0


def test_an_unexpected_error_is_a_500_in_openais_shape_with_the_traceback_only_in_the_log(tiny_home, caplog):  # noqa: F811
    def broken_lookup(model_id):
        raise RuntimeError("a bug in the model lookup")

    queue = EngineQueue()
    live = Live(Server(queue, default_model="tiny", known_model=broken_lookup).app())
    server_log = logging.getLogger("uvicorn.error")  # where uvicorn logs what the app raised (set up by Live)
    server_log.addHandler(caplog.handler)
    try:
        response = post(live, json.dumps({"model": "tiny", "messages": HI}).encode())
    finally:
        live.stop()
        queue.close()
        server_log.removeHandler(caplog.handler)
    assert response.status_code == 500
    assert "Traceback" not in response.text and "a bug in the model lookup" not in response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "server_error"
    assert "a bug in the model lookup" in caplog.text  # the server's log has what went wrong
