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


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_engine_and_kernels_have_no_import_cycles():
    """Counting imports inside functions too: a lazy import that closes a cycle
    (prompt -> session -> prompt) still ties two modules into one."""
    files = [*ROOT.glob("engine/**/*.py"), *ROOT.glob("kernels/**/*.py")]
    assert len(files) > 10
    graph = {
        module_name(p): {m for m in imported_modules(p) if m.split(".")[0] in ("engine", "kernels")} for p in files
    }
    cycles = []

    def visit(node, path):
        for dep in sorted(graph.get(node, ())):
            if dep == path[0]:
                cycles.append(" -> ".join(path + [dep]))
            elif dep not in path and dep in graph:
                visit(dep, path + [dep])

    for start in sorted(graph):
        visit(start, [start])
    assert cycles == []
    assert graph["engine.session"]  # the graph is real: the session imports engine modules
