"""Brisk's package data: icons, stylesheets and texts.

Found through importlib.resources, so they are there in a source checkout, an installed
wheel and a frozen bundle alike (paths built from `__file__`'s parents were not: an
installed wheel lost its icons and styles without a word)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# What the app needs; `brisk-app --check` reports any that is missing.
ICON_NAMES = ("brisk", "new", "send", "stop", "attach", "document", "check")
STYLES = ("light.qss", "dark.qss")


def path(*parts: str) -> Path:
    """A resource as a real file path (Qt opens icons by path). Brisk ships unzipped, so
    the package is a folder on disk in every install."""
    return Path(str(files(__name__).joinpath(*parts)))


def read_text(*parts: str) -> str:
    return files(__name__).joinpath(*parts).read_text(encoding="utf-8")


def missing() -> list[str]:
    """The resources the app needs that are not there, as relative paths."""
    wanted = [f"icons/{name}.svg" for name in ICON_NAMES] + [f"styles/{name}" for name in STYLES]
    return [name for name in wanted if not path(*name.split("/")).is_file()]
