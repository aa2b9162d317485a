"""brisk-app with a malformed HF_ENDPOINT: one line and status 1, before any window (the
engine's import of huggingface_hub raised a ValueError traceback)."""

from brisk.app.main import main


def test_app_refuses_bad_hf_endpoint(monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", "http://[::1")
    assert main(["--check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("brisk-app: error: HF_ENDPOINT is not a valid URL") and "Traceback" not in err
