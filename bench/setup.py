"""This folder installs as `brisk.bench`, at Brisk's version and needing exactly that Brisk (its
metadata is in pyproject.toml)."""

import ast
from email.parser import Parser
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def brisk_version() -> str:
    """engine/version.py's `__version__` in a checkout; in this folder's sdist, which cannot hold
    ../engine, the version setuptools wrote into its PKG-INFO (only an sdist has one here)."""
    if (HERE / "PKG-INFO").exists():
        return Parser().parsestr((HERE / "PKG-INFO").read_text())["Version"]
    source = HERE.parent / "engine" / "version.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            return ast.literal_eval(node.value)
    raise RuntimeError(f"no __version__ in {source}")


class BuildPy(build_py):
    """The package is this folder, so its modules would include this script."""

    def find_package_modules(self, package, package_dir):
        return [found for found in super().find_package_modules(package, package_dir) if found[1] != "setup"]


version = brisk_version()
setup(
    version=version,
    install_requires=[f"brisk=={version}"],
    packages=["brisk.bench"],
    package_dir={"brisk.bench": "."},
    cmdclass={"build_py": BuildPy},
)
