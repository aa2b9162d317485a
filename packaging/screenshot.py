"""Screenshots of the real app on a demo conversation: a document attached, sparse prefill
on, a draft model set; mid-prefill, answered, its settings, and in dark mode. Runs under
Xvfb when DISPLAY is set (else offscreen) and writes PNGs.

    python packaging/screenshot.py --target qwen2.5-coder-0.5b-instruct --draft smollm2-135m-instruct --out docs/
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DOCUMENT = (
    "Quarterly water report.\n\n"
    + (
        "The northern districts used 12% more water than last year, mostly for irrigation. "
        "The southern reservoirs stayed full after a wet spring. Engineers proposed replacing "
        "the oldest pipes on Harbour Street, where leaks cost an estimated 40,000 litres a day. "
        "The council will vote on the pipe budget on 14 March. "
    )
    * 40
)
QUESTION = "When will the council vote on the pipe budget, and why are new pipes needed?"


def wait(app, predicate, timeout_s: float) -> None:
    import time

    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError("the demo did not finish in time")
        app.processEvents()
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--draft", default="smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=Path("resources/screenshots"))
    args = parser.parse_args()
    if not os.environ.get("DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from brisk.app.main import build_window
    from brisk.app.theme import apply_theme

    app = QApplication(sys.argv[:1])
    apply_theme(app, "light")
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="brisk-shot-"))
    window = build_window(model_id=args.target, store_path=workdir / "demo.db")
    window.resize(1400, 860)
    window.show()
    wait(app, lambda: "loaded" in window.dashboard.model_state.text(), 600)
    panel = window.settings_panel
    panel.set_settings(
        replace(
            panel.settings(),
            model=args.target,
            draft=args.draft,
            sparse_prefill="on",
            sparse_keep=0.3,
            spec_decode="auto",
            temperature=0.0,
            max_tokens=64,
        )
    )
    panel._emit()
    doc = workdir / "water-report.txt"
    doc.write_text(DOCUMENT, encoding="utf-8")
    window.controller.attach(str(doc))
    wait(app, lambda: window.composer.attachments, 300)
    window.composer.edit.setPlainText(QUESTION)
    window.composer.send_button.click()
    # mid-prefill: the bar names the phase (the draft reading the prompt, step 1 of 3)
    wait(
        app,
        lambda: (
            window.prefill_bar.isVisible()
            and window.prefill_bar.format().startswith("Step 1")
            and window.prefill_bar.value() > 0
        ),
        600,
    )
    shots = [_save(window, args.out / "brisk-prefill.png")]
    wait(app, lambda: not window.controller.busy, 900)
    window.tint.setChecked(True)
    app.processEvents()
    shots.append(_save(window, args.out / "brisk-chat.png"))
    window.show_settings()
    app.processEvents()
    shots.append(_save(window, args.out / "brisk-settings.png"))
    window.tabs.setCurrentIndex(0)
    apply_theme(app, "dark")
    app.processEvents()
    shots.append(_save(window, args.out / "brisk-dark.png"))
    window.engine.shutdown()
    print("wrote " + ", ".join(str(s) for s in shots))
    return 0


def _save(window, path: Path) -> Path:
    window.grab().save(str(path))
    return path


if __name__ == "__main__":
    sys.exit(main())
