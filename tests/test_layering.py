"""engine/ and kernels/ never import Qt or the app (the GUI depends on them, not back)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("PySide6", "PyQt5", "PyQt6", "app")


def imported_modules(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_engine_and_kernels_do_not_import_qt_or_app():
    offenders = []
    files = [*ROOT.glob("engine/**/*.py"), *ROOT.glob("kernels/**/*.py")]
    assert len(files) > 10
    for path in files:
        for module in imported_modules(path):
            if module.split(".")[0] in FORBIDDEN:
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []
