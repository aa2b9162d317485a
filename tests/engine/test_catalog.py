"""`brisk models search` and the catalogue details through the real huggingface_hub client
against a loopback hub (tests/hub_server.py): results, --json, offline, hostile replies."""

import json
import socket

import pytest

from brisk.engine.api.errors import DownloadError
from brisk.engine.host.cli import main
from brisk.engine.models.catalog import NO_LICENCE, CatalogError, bundled_models, estimate_fit, search_hub
from tests.hub_server import HubServer
from tests.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    make_tiny_model(root / "acme" / "tiny-llama", context_length=2048)
    (root / "acme" / "tiny-llama" / ".hub.json").write_text(json.dumps({"cardData": {"license": "apache-2.0"}}))
    make_tiny_model(root / "acme" / "tiny-llama-4bit", quantize=4)
    (root / "acme" / "tiny-llama-4bit" / ".hub.json").write_text(json.dumps({"tags": ["mlx", "license:mit"]}))
    bert = make_tiny_model(root / "other" / "tiny-bert")
    bert_config = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**bert_config, "model_type": "bert"}))
    gguf = root / "acme" / "tiny-llama-GGUF"
    gguf.mkdir()
    (gguf / "tiny-llama.Q4_K_M.gguf").write_bytes(b"G" * 3000)
    (gguf / "tiny-llama.Q8_0.gguf").write_bytes(b"G" * 5000)
    (gguf / ".hub.json").write_text(json.dumps({"gguf": {"context_length": 4096, "architecture": "llama"}}))
    return root


@pytest.fixture
def hub(hub_root, monkeypatch):
    with HubServer(hub_root) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def by_id(result):
    return {m.id: m for m in result.models}


def test_search_lists_size_quantization_licence_context_support_and_fit(hub, hub_root):
    found = by_id(search_hub("tiny", memory_available=8 << 30))
    assert set(found) == {"acme/tiny-llama", "acme/tiny-llama-4bit", "other/tiny-bert", "acme/tiny-llama-GGUF"}
    plain = found["acme/tiny-llama"]
    assert plain.size_bytes == (hub_root / "acme" / "tiny-llama" / "model.safetensors").stat().st_size
    assert plain.licence == "apache-2.0" and plain.context_length == 2048 and plain.architecture == "llama"
    assert plain.supported and "llama" in plain.support_note and "not quantized" in plain.quantization
    assert plain.fit.fits and plain.fit.text == "yes, full context at 16-bit KV"
    quantized = found["acme/tiny-llama-4bit"]
    assert quantized.quantization == "4-bit MLX, groups of 32" and quantized.licence == "mit"
    bert = found["other/tiny-bert"]
    assert not bert.supported and "'bert'" in bert.support_note and bert.licence == NO_LICENCE
    gguf = found["acme/tiny-llama-GGUF"]
    assert gguf.quantization == "GGUF Q4_K_M, Q8_0" and gguf.size_bytes == 3000
    assert gguf.size_note == "smallest GGUF file" and gguf.context_length == 4096 and not gguf.supported
    # the search itself went to the hub's list endpoint, with the text and the limit
    assert any(r.startswith("GET /api/models") and "/api/models/" not in r for r in hub.requests)
    assert hub.queries[0] == {"search": ["tiny"], "limit": ["10"], "sort": ["downloads"]}


def test_search_limit_and_no_match(hub):
    assert len(search_hub("tiny", limit=2).models) == 2
    assert search_hub("nothing-like-this").models == []


def test_fit_follows_memory_and_kv_bits(hub, hub_root):
    config = json.loads((hub_root / "acme" / "tiny-llama" / "config.json").read_text())
    full = by_id(search_hub("acme/tiny-llama", memory_available=1 << 30))["acme/tiny-llama"]
    weights, per_token = full.fit.weights_bytes, full.fit.kv_bytes_per_token
    # 16-bit KV: 2 (K and V) x layers x KV heads x head size x 2 bytes a token
    heads = config["num_key_value_heads"]
    assert (
        per_token
        == 2 * config["num_hidden_layers"] * heads * config["hidden_size"] // config["num_attention_heads"] * 2
    )
    # memory for 3,000 tokens beside the weights: the context is cut to them
    tight = estimate_fit(weights, config, 1 << 20, memory_available=weights + int(per_token * 3000))
    assert tight.fits and tight.max_context == 3000 and "up to 3,000 tokens" in tight.text
    assert not estimate_fit(weights, config, 2048, memory_available=weights + int(per_token * 100)).fits
    assert not estimate_fit(weights, None, 2048, memory_available=weights // 2).fits
    packed = by_id(search_hub("acme/tiny-llama", k_bits=4, v_bits=4))["acme/tiny-llama"]
    assert packed.fit.kv_bytes_per_token < per_token / 2 and "4-bit KV" in packed.fit.text


def test_cli_search_prints_details_and_json(hub, capsys):
    assert main(["models", "search", "tiny-llama-4bit"]) == 0
    out = capsys.readouterr().out
    assert (
        "acme/tiny-llama-4bit" in out and "4-bit MLX" in out and "licence: mit" in out and "runs in Brisk: yes" in out
    )
    assert main(["models", "search", "tiny", "--json", "--limit", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["models"]) == 3 and data["endpoint"] == hub.url
    assert {"size_bytes", "quantization", "licence", "context_length", "supported", "fit"} <= set(data["models"][0])


def test_cli_bundled_lists_details_and_says_when_no_licence_is_stated(capsys):
    assert main(["models", "bundled"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b-instruct" in out and "491 MB" in out and "Q4_K_M" in out
    assert "licence: no licence stated" in out and "context 32,768 tokens" in out
    unstated = [m for m in bundled_models() if not m.licence_stated]
    assert {m.id for m in unstated} == {"qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"}


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_offline_is_one_line_and_a_failure(monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", _closed_port())
    with pytest.raises(CatalogError, match="are you offline"):
        search_hub("tiny")
    assert main(["models", "search", "tiny"]) != 0
    err = capsys.readouterr().err
    assert "are you offline" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


HOSTILE_LISTS = [
    (b"not json at all", "not JSON"),
    (json.dumps({"models": []}).encode(), "dict, not a list"),
    (b"[" + b'{"id": "x/y"},' * 700_000 + b'{"id": "x/y"}]', "more than 8 MiB"),
]


@pytest.mark.parametrize("body, match", HOSTILE_LISTS)
def test_a_hostile_search_reply_is_one_clear_error(hub_root, monkeypatch, capsys, body, match):
    with HubServer(hub_root, replies={"/api/models": body}) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        with pytest.raises(CatalogError, match=match):
            search_hub("tiny")
        assert main(["models", "search", "tiny"]) == 1
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_bad_entries_hide_only_themselves(hub_root, monkeypatch):
    listing = [
        "a string",
        {"id": 42},
        {"id": "../../etc/passwd"},
        {"no": "id"},
        {"id": "acme/tiny-llama"},
        {"id": "acme/wrong-types"},
        {"id": "acme/wrong-shape"},
        {"id": "acme/missing"},
    ]
    replies = {
        "/api/models": json.dumps(listing).encode(),
        # every field of the wrong type: siblings a string, card data a list, tags a number
        "/api/models/acme/wrong-types": json.dumps(
            {"id": "acme/wrong-types", "siblings": "all of them", "cardData": [1], "tags": 7, "gguf": "big"}
        ).encode(),
        # siblings with sizes that are not byte counts, config a list
        "/api/models/acme/wrong-shape": json.dumps(
            {
                "id": "acme/wrong-shape",
                "siblings": [{"rfilename": "model.safetensors", "size": "huge"}, {"rfilename": 5, "size": -1}],
                "config": ["model_type"],
                "cardData": {"license": ["mit", 3]},
            }
        ).encode(),
    }
    with HubServer(hub_root, replies=replies) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        result = search_hub("tiny", limit=20)
    found = by_id(result)
    assert found["acme/tiny-llama"].supported  # the good entry is listed in full
    assert [s for s in result.skipped if "valid repo id" in s] == [
        "4 entries without a valid repo id (the first: 'a string')"
    ]
    assert any(s.startswith("acme/missing: not found") for s in result.skipped)
    shape = found["acme/wrong-shape"]
    assert shape.size_bytes is None and shape.licence == "mit" and not shape.supported
    assert "acme/wrong-types: its details are malformed (TypeError)" in result.skipped


def test_a_list_of_a_hundred_thousand_bad_entries_is_one_line(hub_root, monkeypatch):
    listing = [{"id": 7}] * 100_000
    with HubServer(hub_root, replies={"/api/models": json.dumps(listing).encode()}) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        result = search_hub("model")
    assert result.models == [] and result.skipped == ["100000 entries without a valid repo id (the first: {'id': 7})"]


def test_a_hub_that_ignores_the_limit_is_cut_to_it(hub_root, monkeypatch):
    listing = [{"id": f"acme/model-{i}"} for i in range(5000)]
    with HubServer(hub_root, replies={"/api/models": json.dumps(listing).encode()}) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        result = search_hub("model", limit=3)
    asked = [r for r in hostile.requests if r.startswith("GET /api/models/")]
    assert len(asked) == 3 and len(result.skipped) == 3  # none of them exists: only three were asked about


def test_control_characters_and_long_licences_are_cleaned(hub_root, monkeypatch):
    replies = {
        "/api/models": json.dumps([{"id": "acme/tiny-llama"}]).encode(),
        "/api/models/acme/tiny-llama": json.dumps(
            {"id": "acme/tiny-llama", "siblings": [], "cardData": {"license": "\x1b[2Jevil\x07" + "x" * 500}}
        ).encode(),
    }
    with HubServer(hub_root, replies=replies) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        (model,) = search_hub("tiny").models
    assert "\x1b" not in model.licence and "\x07" not in model.licence and len(model.licence) <= 80


def test_the_limit_option_is_checked(capsys):
    with pytest.raises(SystemExit):
        main(["models", "search", "tiny", "--limit", "0"])
    assert "from 1 to 50" in capsys.readouterr().err


def test_a_model_commands_error_is_the_managers_in_the_apps_words(tmp_path):
    """Through the worker as the app runs it: not a chat's EngineErrored, no CLI advice."""
    from brisk.engine.api.session import CancelToken
    from brisk.engine.host.model_commands import ModelCommandFailed, PullModel
    from brisk.engine.host.worker import EngineWorker
    from brisk.engine.models.store import ModelStore

    ModelStore().install_folder(make_tiny_model(tmp_path / "m"), model_id="taken", source="test")
    (event,) = EngineWorker(lambda mid: None).handle(PullModel("acme/tiny-llama", "taken"), CancelToken())
    assert isinstance(event, ModelCommandFailed) and event.kind == "download"
    assert "already installed" in event.message and "brisk models rm" not in event.message
    assert "remove it in Models first" in event.message
    ModelStore().remove("taken")


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama", "num_hidden_layers": "many", "num_attention_heads": 0, "hidden_size": 64},
        {"model_type": ["llama"], "max_position_embeddings": -5, "text_config": [1, 2]},
        {"model_type": "../../os", "max_position_embeddings": True, "num_hidden_layers": 1 << 40},
        ["not", "an", "object"],
    ],
)
def test_a_hostile_config_leaves_details_unknown_not_a_traceback(hub_root, monkeypatch, config):
    from tests.hub_server import COMMIT

    replies = {f"/acme/tiny-llama/resolve/{COMMIT}/config.json": json.dumps(config).encode()}
    with HubServer(hub_root, replies=replies) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        model = by_id(search_hub("acme/tiny-llama", limit=1))["acme/tiny-llama"]
    assert model.size_bytes and model.fit.kv_bytes_per_token is None  # the weights are still counted
    if isinstance(config, dict) and config["model_type"] != "llama":
        assert not model.supported


def test_a_hub_that_dribbles_its_reply_is_stopped(hub, monkeypatch):
    """Each chunk arrives within the read timeout, but the reply as a whole takes too long
    (a fake clock advances a minute per chunk read)."""
    ticks = iter(range(0, 10_000, 61))
    monkeypatch.setattr("brisk.engine.models.catalog._clock", lambda: next(ticks))
    with pytest.raises(CatalogError, match="too slowly"):
        search_hub("tiny")


def test_models_list_says_an_installed_bundled_models_licence(tmp_path, capsys):
    from brisk.engine.models.store import ModelStore

    tiny = make_tiny_model(tmp_path / "m")
    store = ModelStore()
    store.install_folder(tiny, model_id="qwen2.5-coder-0.5b-instruct", source="test")
    store.install_folder(tiny, model_id="from-a-hub", source="test")
    try:
        assert main(["models", "list"]) == 0
        lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
        assert "no licence stated" in lines["qwen2.5-coder-0.5b-instruct"]
        assert "see its model card" in lines["from-a-hub"]
    finally:
        store.remove("qwen2.5-coder-0.5b-instruct"), store.remove("from-a-hub")


def test_a_search_does_not_fetch_the_hubs_agent_registry(hub, monkeypatch, tmp_path):
    """huggingface_hub's build_hf_headers fetches the endpoint's /api/agent-harnesses once per
    process and reads it whole: a hostile hub's gzip bomb there took gigabytes before a search
    began. The search sends the user's token without it."""
    import huggingface_hub.utils._detect_agent as agent

    from brisk.engine.models.catalog import _hub_headers

    monkeypatch.setattr(agent, "_registry", None)  # as in a fresh process, telemetry on (the default)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY", False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.url)  # as when HF_ENDPOINT is set at start
    monkeypatch.setattr("huggingface_hub.constants.AGENT_HARNESSES_PATH", str(tmp_path / "none.json"))
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_IMPLICIT_TOKEN", False)
    assert search_hub("tiny-llama-4bit").models
    assert not [r for r in hub.requests if "agent-harnesses" in r]
    assert _hub_headers()["authorization"] == "Bearer hf_secret"  # the user's token still goes with it


def test_runs_in_brisk_says_no_where_pull_would_refuse(tmp_path, monkeypatch):
    """A repo without a config.json file (the hub's summary still names llama), and a hub that
    lists weights without their sizes: the catalogue said 'yes' and Install failed."""
    from brisk.engine.api.errors import UnsupportedModel
    from brisk.engine.models.download import pull

    root = tmp_path / "hub"
    bare = make_tiny_model(root / "acme" / "no-config-llama")
    (bare / ".hub.json").write_text(json.dumps({"config": {"model_type": "llama"}}))
    (bare / "config.json").rename(bare / "config.json.orig")
    make_tiny_model(root / "acme" / "tiny-llama")
    with HubServer(root) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        model = by_id(search_hub("no-config"))["acme/no-config-llama"]
        assert not model.supported and model.support_note == "no config.json file to download"
        with pytest.raises(UnsupportedModel, match="no config.json"):
            pull("acme/no-config-llama")
    with HubServer(root, omit_sizes=True) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        model = by_id(search_hub("tiny-llama"))["acme/tiny-llama"]
        assert not model.supported and "how large" in model.support_note
        with pytest.raises(DownloadError, match="how large"):
            pull("acme/tiny-llama")


def test_the_fit_never_counts_less_memory_than_the_weights_files(tmp_path, monkeypatch):
    """A hub whose parameter count (a few thousand float32s) disagrees with its file list
    (900 GB of weights): the row said '900.00 GB' and 'yes, full context'."""
    root = tmp_path / "hub"
    big = make_tiny_model(root / "acme" / "big-llama")
    siblings = [{"rfilename": "config.json", "size": 100}, {"rfilename": "model.safetensors", "size": 900 * 10**9}]
    (big / ".hub.json").write_text(json.dumps({"siblings": siblings}))
    with HubServer(root) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        model = by_id(search_hub("big-llama", memory_available=8 << 30))["acme/big-llama"]
    assert model.size_bytes == 900 * 10**9 and model.fit.weights_bytes >= model.size_bytes
    assert model.fit.fits is False and model.fit.text.startswith("no: 900.00 GB of weights")


def test_search_text_longer_than_any_repo_id_is_one_clear_line(hub, capsys):
    """100,000 characters failed inside httpx ('InvalidURL: URL component 'query' too long')."""
    assert main(["models", "search", "x" * 100_000]) == 1
    err = capsys.readouterr().err
    assert "The search text is 100,000 characters" in err and len(err.strip().splitlines()) == 1
    assert not hub.requests  # nothing was sent
    assert main(["models", "search", "acme/" + "x" * 190]) == 0  # a repo id's length is searched


def test_a_search_stops_asking_about_results_once_it_has_taken_too_long(hub_root, monkeypatch):
    """Each reply within its own limit, but 50 results asked 8 at a time from a slow hub took
    minutes: past MAX_SEARCH_S (a fake clock, 30 s a reading) the rest are one skipped line."""
    import itertools

    from brisk.engine.models.catalog import MAX_SEARCH_S

    ticks = itertools.count(0, 30)
    monkeypatch.setattr("brisk.engine.models.catalog._clock", lambda: next(ticks))
    listing = [{"id": f"acme/model-{i}"} for i in range(50)]
    with HubServer(hub_root, replies={"/api/models": json.dumps(listing).encode()}) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        result = search_hub("model", limit=50)
    asked = [r for r in hostile.requests if r.startswith("GET /api/models/")]
    assert len(asked) < 8 and result.models == []
    late = [s for s in result.skipped if "not looked up" in s]
    assert late == [f"{50 - len(asked)} results not looked up: the hub took over {MAX_SEARCH_S} s"]


def test_a_repo_name_that_makes_no_local_id_is_not_offered_to_install(tmp_path, monkeypatch, capsys):
    """Hub names run to 96 characters, local ids to 80: the row said 'yes', and the app's
    Install raised BriskError inside a Qt slot (pull: 'Invalid model id')."""
    name = "Llama-3.1-8B-Instruct-abliterated-uncensored-finetuned-on-everything-GPTQ-4bit-MLX-ok"
    make_tiny_model(tmp_path / "hub" / "acme" / name)
    with HubServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        model = by_id(search_hub("abliterated"))[f"acme/{name}"]
        assert not model.supported and "pull --id NAME" in model.support_note
        assert main(["models", "pull", f"acme/{name}", "--id", "short-llama"]) == 0  # as it says
    assert "installed short-llama" in capsys.readouterr().out
    from brisk.engine.models.store import ModelStore

    ModelStore().remove("short-llama")


def test_one_result_the_hub_never_answers_about_hides_only_itself(hub, hub_root, monkeypatch):
    """A read timeout on one model's details was taken for 'are you offline?' and ended the
    whole search; only a connection that cannot be made means that."""
    monkeypatch.setattr("brisk.engine.models.catalog.REQUEST_TIMEOUT_S", 0.5)
    with HubServer(hub_root, stalls={"/api/models/acme/tiny-llama-4bit": 3}) as slow:
        monkeypatch.setenv("HF_ENDPOINT", slow.url)
        result = search_hub("tiny-llama")
    assert "acme/tiny-llama" in by_id(result) and "acme/tiny-llama-4bit" not in by_id(result)
    assert any(s.startswith("acme/tiny-llama-4bit: The hub at") and "did not answer" in s for s in result.skipped)


def test_json_nested_too_deeply_is_one_clear_line(hub_root, monkeypatch, capsys):
    """200,000 nested brackets (400 kB) raised RecursionError: the CLI said 'failed
    unexpectedly', and a config nested so hid its whole model instead of its context."""
    from tests.hub_server import COMMIT

    deep_list = b"[" * 200_000 + b"]" * 200_000
    deep_object = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    with HubServer(hub_root, replies={"/api/models": deep_list}) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        assert main(["models", "search", "tiny"]) == 1
    err = capsys.readouterr().err
    assert "sent JSON nested too deeply for /api/models" in err and "unexpectedly" not in err
    config = f"/acme/tiny-llama/resolve/{COMMIT}/config.json"
    with HubServer(hub_root, replies={config: deep_object}) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        model = by_id(search_hub("acme/tiny-llama", limit=1))["acme/tiny-llama"]
    assert model.size_bytes and model.context_length is None


def test_a_licence_of_other_shows_its_name(hub_root, monkeypatch):
    """Model cards say 'license: other' and name it in license_name; the row said 'other'."""
    card = {"license": "other", "license_name": "qwen-research", "license_link": "LICENSE"}
    replies = {
        "/api/models": json.dumps([{"id": "acme/tiny-llama"}]).encode(),
        "/api/models/acme/tiny-llama": json.dumps({"id": "acme/tiny-llama", "siblings": [], "cardData": card}).encode(),
    }
    with HubServer(hub_root, replies=replies) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        (model,) = search_hub("tiny").models
    assert model.licence == "other: qwen-research"


def test_matches_the_hub_could_not_describe_are_not_called_no_match(hub_root, monkeypatch, capsys):
    listing = [{"id": "acme/gone"}, {"id": "acme/also-gone"}]
    with HubServer(hub_root, replies={"/api/models": json.dumps(listing).encode()}) as hostile:
        monkeypatch.setenv("HF_ENDPOINT", hostile.url)
        assert main(["models", "search", "gone"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("None of the models matching 'gone'") and "could be shown" in out
    assert "skipped acme/gone: not found" in err
