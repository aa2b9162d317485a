"""The app's own preferences, kept in BRISK_HOME/app.ini: the theme, and the draft step
costs measured on this machine (the settings panel ranks drafts by them)."""

from __future__ import annotations

from PySide6.QtCore import QSettings


def preferences() -> QSettings:
    from brisk.engine.models.store import brisk_home

    return QSettings(str(brisk_home() / "app.ini"), QSettings.IniFormat)


def _cost_key(target: str, draft: str) -> str:
    # QSettings reads "/" as a group separator: ids like "org/model" must not split
    return "draft_costs/" + f"{target}|{draft}".replace("/", "%2F")


def measured_draft_cost(target: str, draft: str) -> float | None:
    """A draft step's cost in target steps, as last measured for this pair, or None."""
    try:
        value = float(preferences().value(_cost_key(target, draft), 0.0))
    except (TypeError, ValueError):  # a hand-edited file
        return None
    return value if value > 0 else None


def record_draft_cost(target: str, draft: str, ratio: float) -> None:
    if ratio > 0:
        settings = preferences()
        settings.setValue(_cost_key(target, draft), round(ratio, 4))
        settings.sync()


# --- system-prompt presets the user saved (the built-in ones live in app/widgets/prompt_presets.py)

PRESETS_KEY = "system_prompt_presets"
# A preset's name shows in a combo box; its text is a system prompt like any other.
MAX_PRESET_NAME_CHARS = 60
MAX_PRESETS = 200


def saved_prompt_presets() -> dict[str, str]:
    """The user's presets, name -> text, in the order saved. A hand-edited entry that is not
    a name and a text is skipped."""
    import json

    try:
        data = json.loads(str(preferences().value(PRESETS_KEY, "{}")))
    except (TypeError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        name[:MAX_PRESET_NAME_CHARS]: text
        for name, text in list(data.items())[:MAX_PRESETS]
        if isinstance(name, str) and name.strip() and isinstance(text, str) and text.strip()
    }


def write_prompt_presets(presets: dict[str, str]) -> None:
    import json

    settings = preferences()
    settings.setValue(PRESETS_KEY, json.dumps(presets, ensure_ascii=False))
    settings.sync()
