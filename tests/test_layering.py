"""Layering: engine/, kernels/ and the benchmarks (bench/) never import Qt or the app, Brisk never
imports the benchmarks (they import it), and no modules anywhere import each other in a cycle
(lazy imports inside functions and type-only imports count too)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "kernels", "app", "resources", "bench")
FORBIDDEN = ("PySide6", "PyQt5", "PyQt6", "app")
# Installed, the packages may sit under one `brisk` name (brisk.engine is engine/).
INSTALL_PREFIX = "brisk."

# Known cycles, each as the set of modules tied together, with why they are tolerated for now.
# Any other cycle fails the test, and so does one of these once untied (the list only shrinks).
# (kernels.mlx_extension <-> native <-> prebuilt, the first found, was untied in 37181f6.)
EXPECTED_CYCLES: dict[frozenset[str], str] = {}

# Brisk's wheel leaves the benchmarks out (bench/ is its own distribution, brisk-bench), so Brisk's
# modules must not import them. The exceptions, each with why; the list only shrinks.
BENCH_IMPORTERS: dict[str, str] = {}
# Benchmarks that drive the app (so import Qt and the app), each with why; the list only shrinks.
APP_BENCHMARKS: dict[str, str] = {
    "bench.app_latency": "the window's own event-loop latency while the engine works: it runs the real window",
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files(*packages: str) -> list[Path]:
    return [p for package in packages for p in sorted((ROOT / package).glob("**/*.py"))]


def local_modules() -> set[str]:
    return {module_name(p) for p in source_files(*PACKAGES)}


def _absolute(name: str) -> str:
    return name[len(INSTALL_PREFIX) :] if name.startswith(INSTALL_PREFIX) else name


def imported_modules(path: Path, known: frozenset[str] | set[str] = frozenset(), root: Path = ROOT):
    """Every module `path` imports, wherever the import sits (module level, a function, an
    `if TYPE_CHECKING:` block). `from pkg import name` yields `pkg.name` when that is a module
    in `known` (`from kernels import ctypes_library` imports kernels.ctypes_library), else `pkg`; relative
    imports are resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (_absolute(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = _absolute(node.module or "")
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base


def import_graph(packages=PACKAGES) -> dict[str, set[str]]:
    known = local_modules()
    return {module_name(p): {m for m in imported_modules(p, known) if m in known} for p in source_files(*packages)}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (or a module importing
    itself): each is one or more import cycles (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph.get(dep, ())))))
                elif dep in on_stack:
                    low[node] = min(low[node], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(frozenset(component))
    return found


def test_engine_kernels_and_benchmarks_do_not_import_qt_or_app():
    offenders = []
    files = source_files("engine", "kernels", "bench")
    assert len(source_files("bench")) > 10 and len(files) > 50
    for path in files:
        if module_name(path) in APP_BENCHMARKS:
            continue
        for module in imported_modules(path):
            if module.split(".")[0] in FORBIDDEN:
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []
    assert all((ROOT / (m.replace(".", "/") + ".py")).is_file() for m in APP_BENCHMARKS)  # still there


def _is_bench(module: str) -> bool:
    return module == "bench" or module.startswith("bench.")


def test_brisk_never_imports_the_benchmarks():
    """The benchmarks import the engine, never the reverse (a lazy import inside a function counts:
    it fails the day it runs from a wheel)."""
    graph = import_graph()
    assert "bench.common" in graph["bench.app_latency"]  # `from brisk.bench.common import ...` is seen
    importers = {module for module, deps in graph.items() if not _is_bench(module) and any(map(_is_bench, deps))}
    assert importers == set(BENCH_IMPORTERS)


def test_no_import_cycles_anywhere():
    """Counting imports inside functions too: a lazy import that closes a cycle
    (prompt -> session -> prompt) still ties two modules into one."""
    graph = import_graph()
    assert "kernels.ctypes_library" in graph["kernels.mlx_extension"]  # `from kernels import ctypes_library` is seen
    found = {component: sorted(component) for component in cycles(graph)}
    new = [" <-> ".join(names) for component, names in found.items() if component not in EXPECTED_CYCLES]
    assert new == [], "modules that import each other (a cycle)"
    gone = [" <-> ".join(sorted(c)) for c in EXPECTED_CYCLES if c not in found]
    assert gone == [], "a known cycle was untied: remove it from EXPECTED_CYCLES"


def test_the_cycle_finder_sees_from_imports_lazy_imports_and_relative_ones(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(map(sorted, cycles(graph))) == [["a", "b", "c"], ["e"]]
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("def f():\n    from pkg import two\n    from .three import x\n")
    known = {"pkg", "pkg.one", "pkg.two", "pkg.three"}
    assert set(imported_modules(package / "one.py", known, root=tmp_path)) == {"pkg.two", "pkg.three"}


def test_every_source_folder_is_a_package():
    # pyproject's package discovery has namespaces off: a folder of modules without an
    # __init__.py runs from a checkout but is left out of the wheel and the bundle
    # (engine/distributed/ was, and `brisk info` failed there with ModuleNotFoundError).
    missing = [
        str(folder.relative_to(ROOT))
        for top in PACKAGES
        for folder in [ROOT / top, *(ROOT / top).rglob("*")]
        if folder.is_dir()
        and "__pycache__" not in folder.parts
        and any(folder.glob("*.py"))
        and not (folder / "__init__.py").exists()
    ]
    assert not missing, f"folders of modules with no __init__.py (left out of the wheel): {missing}"
