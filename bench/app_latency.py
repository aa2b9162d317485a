"""Event-loop latency of the real window while the engine prefills a long prompt and while
it decodes: a 4 ms timer records how late each tick fires (the GUI thread must never wait
on MLX; goal p99 <= 16 ms, one frame at 60 Hz).

    python -m brisk.bench.app_latency --model smollm2-135m-instruct --prompt-tokens 2048 --gen 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TICK_MS = 4


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brisk.bench.app_latency")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--gen", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from brisk.app.main import build_window
    from brisk.bench.common import filler_text
    from brisk.engine.api.events import PrefillProgressed, TokenEmitted
    from brisk.engine.host.worker import ConversationEvent

    app = QApplication(sys.argv[:1])
    window = build_window(model_id=args.model, store_path=Path(tempfile.mkdtemp()) / "b.db")
    window.show()
    phase = {"name": "idle"}
    lateness: dict[str, list[float]] = {"idle": [], "prefill": [], "decode": []}
    last = [time.perf_counter()]

    def tick():
        now = time.perf_counter()
        lateness.setdefault(phase["name"], []).append(max(0.0, (now - last[0]) * 1000 - TICK_MS))
        last[0] = now

    def on_event(item):
        if isinstance(item, ConversationEvent):
            if isinstance(item.event, PrefillProgressed) and phase["name"] != "decode":
                phase["name"] = "prefill"
            elif isinstance(item.event, TokenEmitted):
                phase["name"] = "decode"

    window.engine.event.connect(on_event)
    timer = QTimer(interval=TICK_MS)
    timer.timeout.connect(tick)
    deadline = time.monotonic() + 600
    while "loaded" not in window.dashboard.model_state.text() and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    panel = window.settings_panel
    panel.temperature.setValue(0.0)
    panel.max_tokens.setValue(args.gen)
    lm_tokenizer = window.engine._worker.model(args.model).tokenizer
    window.controller.busy_changed.connect(lambda busy: None if busy else app.quit())
    timer.start()
    window.composer.edit.setPlainText(filler_text(lm_tokenizer, args.prompt_tokens) + "\n\nSummarize this.")
    window.composer._submit()
    app.exec()  # the real event loop, until the turn ends
    timer.stop()
    window.engine.shutdown()
    result = {
        name: {
            "ticks": len(v),
            "p50_ms": round(statistics.median(v), 2) if v else 0.0,
            "p99_ms": round(percentile(v, 0.99), 2),
            "max_ms": round(max(v, default=0.0), 2),
        }
        for name, v in lateness.items()
        if name != "idle"
    }
    print(
        json.dumps(
            {
                "model": args.model,
                "prompt_tokens": args.prompt_tokens,
                "gen": args.gen,
                "tick_ms": TICK_MS,
                "lateness": result,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
