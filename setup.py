"""Brisk's folders install under one name, `brisk.*` (`brisk.engine`, `brisk.app`, ...), so no other
distribution's top-level `app` or `engine` can replace them or be replaced by them. The folders stay
at the top of the checkout; this maps them (everything else is in pyproject.toml)."""

from setuptools import find_packages, setup

FOLDERS = ("engine", "kernels", "app", "resources")
packages = find_packages(include=[pattern for folder in FOLDERS for pattern in (folder, f"{folder}.*")])
setup(packages=[f"brisk.{package}" for package in packages], package_dir={f"brisk.{f}": f for f in FOLDERS})
