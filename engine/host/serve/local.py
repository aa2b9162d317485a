"""A real uvicorn serving Brisk's API on a loopback port, in a thread of this process (the
app's server toggle, the benchmark and the tests use it; `brisk serve` runs uvicorn in the
foreground)."""

from __future__ import annotations

import socket
import threading
import time

from brisk.engine.host.serve.connections import ConnectionLimits, make_config


class LocalServer:
    """`port=0`: any free port (`url` names the one it got)."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 0, limits: ConnectionLimits | None = None):
        import uvicorn

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.uvicorn = uvicorn.Server(make_config(app, limits=limits))
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the local server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(10)
