"""Faults a tester found in `brisk serve --ranks N` and `brisk run --ranks N`: models the ranks
cannot split, the rank count's rule, stale scratch folders, a killed launcher, a request
after an idle rank died, and a host that never joins (engine/distributed/)."""

from __future__ import annotations

import json

import pytest

from brisk.engine.models.store import ModelStore
from tests.engine.test_serve_ranks import Serving, get

# --- a model the ranks cannot split -------------------------------------------------------


ODD_HEADS = {"hidden_size": 96, "num_attention_heads": 3, "num_key_value_heads": 3}


@pytest.fixture(scope="module")
def split_home(tmp_path_factory):
    """`tq` (qwen2, splits 2 ways), `g` (gemma3_text: mlx-lm has no `shard` for it) and `odd`
    (qwen2 with 3 heads and 3 KV heads: no even 2-way split)."""
    from tests.tiny_models import make_tiny_model

    home = tmp_path_factory.mktemp("split-home")
    store = ModelStore(home)
    folders = {
        "tq": make_tiny_model(tmp_path_factory.mktemp("tq") / "tq", "qwen2", hidden_size=128, intermediate_size=256),
        "g": make_tiny_model(tmp_path_factory.mktemp("g") / "g", "gemma3_text"),
        "odd": make_tiny_model(tmp_path_factory.mktemp("odd") / "odd", "qwen2", **ODD_HEADS),
    }
    for model_id, folder in folders.items():
        store.install_folder(folder, model_id=model_id, source="test")
    return home


def test_a_model_the_ranks_cannot_split_is_a_400_and_left_out_of_the_model_list(split_home):
    """It was a 500 ("The server failed to answer this request"), and /v1/models offered it."""
    server = Serving(split_home, "--ranks", "2")
    try:
        answers = {
            (model, stream): server.chat("hi", model=model, max_tokens=2, stream=stream)
            for model in ("g", "odd")
            for stream in (False, True)
        }
        status, listed = get(server.url, "/v1/models")
    finally:
        err = server.stop()
    for model in ("g", "odd"):
        for stream in (False, True):
            status_code, body = answers[model, stream]
            error = json.loads(body)["error"]
            assert status_code == 400 and error["type"] == "invalid_request_error", body
            assert error["param"] == "model" and error["code"] == "unsupported_model"
            assert error["message"].startswith(f"The model '{model}' cannot be served on 2 ranks: ")
            assert "\n" not in error["message"]
    said = {model: json.loads(answers[model, False][1])["error"]["message"] for model in ("g", "odd")}
    assert "gemma3_text models cannot run on several ranks" in said["g"]
    assert "cannot be split 2 ways: attention heads 3, KV heads 3" in said["odd"]
    assert status == 200 and [m["id"] for m in listed["data"]] == ["tq"]
    assert "Traceback" not in err


def test_a_split_refused_while_loading_is_the_clients_fault_not_the_servers():
    """mlx-lm's own shape checks (quantization groups) refuse only when the model loads."""
    from brisk.engine.distributed.shard import ShardingRefused
    from brisk.engine.host.serve.app import STATUS

    assert STATUS.get(ShardingRefused("x").kind, 500) == 400


# --- the rank count's rule -------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "serve"])
def test_ranks_1_is_refused_as_the_message_and_the_help_say(split_home, command):
    """`--ranks 1` ran one process with no ranks while the error for other counts said 2 to 64
    (mlx.launch cannot start a group of one: its rank reads an empty hostfile)."""
    import argparse

    from brisk.engine.distributed.cli import add_rank_args
    from brisk.engine.distributed.hostfile import MAX_RANKS
    from tests.cli_here import brisk_here
    from tests.engine.test_serve_ranks import free_port

    extra = ["--prompt", "hi", "--max-tokens", "1"] if command == "run" else ["--port", str(free_port())]
    out = brisk_here(split_home, command, "--model", "tq", "--ranks", "1", *extra)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    rule = f"--ranks must be between 2 and {MAX_RANKS} (got 1); leave it out to run in one process"
    assert rule in out.stderr and out.stdout == ""
    parser = argparse.ArgumentParser()
    add_rank_args(parser)
    assert f"N from 2 to {MAX_RANKS}" in " ".join(parser.format_help().split())
    assert parser.parse_args([]).ranks is None  # left out: one process
