"""`brisk serve` refuses at startup what would otherwise fail after its "Brisk serves ..." banner:
a model that is not installed (every request then got a 404) and a port it cannot listen on
(uvicorn printed its raw bind error seconds later). Found by trying `serve --ranks 2` as a user."""

from __future__ import annotations

import socket

from tests.cli_here import brisk_here


def held_port() -> socket.socket:
    """A loopback port something else listens on: an old `brisk serve` fails there too, not forever."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_a_model_that_is_not_installed_is_refused_before_serving(tmp_path):
    with held_port() as holder:
        port = str(holder.getsockname()[1])
        done = brisk_here(tmp_path / "home", "serve", "--model", "nosuch", "--port", port)
    assert done.returncode != 0
    assert "Model 'nosuch' is not installed" in done.stderr, done.stderr
    assert "Brisk serves" not in done.stdout
    assert "Traceback" not in done.stderr


def test_a_port_in_use_is_refused_before_serving(tmp_path, tiny_llama_dir):
    from brisk.engine.models.store import ModelStore

    ModelStore(tmp_path / "home").install_folder(tiny_llama_dir, model_id="tiny", source="test")
    with held_port() as holder:
        port = holder.getsockname()[1]
        done = brisk_here(tmp_path / "home", "serve", "--model", "tiny", "--port", str(port))
    assert done.returncode != 0
    assert f"Cannot listen on 127.0.0.1:{port} (Address already in use)" in done.stderr, done.stderr
    assert "Brisk serves" not in done.stdout
    assert "Traceback" not in done.stderr
