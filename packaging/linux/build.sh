#!/usr/bin/env bash
# Build the self-contained Linux bundle: dist/brisk-<version>-linux-<arch>.tar.gz, a folder
# app (Python, MLX, Qt, MKL, prebuilt kernels) with a .desktop file and icon. It runs on a
# machine with no Python and no compiler.
#
# Why PyInstaller: it is maintained on PyPI, freezes PySide6 with its own hooks (plugins,
# Qt libraries) and has hooks for transformers; it makes the same folder app on Linux and
# the .app BUNDLE on macOS (packaging/macos/), so one spec style serves both. Nuitka
# compiles to C (a compiler and many minutes per build); briefcase makes no Linux tarball.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=${BRISK_BUNDLE_WORK:-$root/build/bundle}
python=${PYTHON:-python3}
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' engine/version.py)
name="brisk-$version-linux-$(uname -m)"

rm -rf "$work/dist" "$work/pyi" "$work/prebuilt"
mkdir -p "$work" dist
# A clean environment with exactly Brisk and its dependencies (not the developer's venv);
# BRISK_BUNDLE_KEEP_VENV=1 reuses the last one and only reinstalls Brisk itself.
if [ "${BRISK_BUNDLE_KEEP_VENV:-0}" = 1 ] && [ -x "$work/venv/bin/pyinstaller" ]; then
    "$work/venv/bin/python" -m pip install -q --no-deps --force-reinstall "$root"
else
    rm -rf "$work/venv"
    "$python" -m venv "$work/venv"
    "$work/venv/bin/python" -m pip install -q --upgrade pip
    "$work/venv/bin/python" -m pip install -q --no-compile "$root[gui]" "pyinstaller==6.22.3"  # PyInstaller compiles what it ships
fi

echo "building the native kernels ahead of time"
"$work/venv/bin/python" packaging/build_kernels.py --out "$work/prebuilt" >/dev/null

echo "freezing"
BRISK_ROOT=$root BRISK_PREBUILT=$work/prebuilt BRISK_MKL_DIR=$work/venv/lib \
    "$work/venv/bin/pyinstaller" --noconfirm --log-level WARN --distpath "$work/dist" --workpath "$work/pyi" \
    packaging/linux/brisk.spec

app="$work/dist/brisk"
ln -sf brisk-app "$app/brisk"  # the command line: same executable, told apart by its name
install -m 644 resources/icons/brisk.svg "$app/brisk.svg"
install -m 644 packaging/linux/brisk.desktop "$app/brisk.desktop"
install -m 755 packaging/linux/install-desktop-entry.sh "$app/install-desktop-entry.sh"
install -m 644 packaging/linux/README.txt "$app/README.txt"

rm -rf "$work/$name" && mv "$app" "$work/$name"
# BRISK_BUNDLE_GZIP: gzip's level (6, its default: 322 MB; CI's throwaway bundles take 1,
# ~12% larger and 2.7x less CPU)
tar -C "$work" -cf - "$name" | gzip "-${BRISK_BUNDLE_GZIP:-6}" > "dist/$name.tar.gz"
mv "$work/$name" "$app"
echo "bundle: dist/$name.tar.gz ($(du -sh "dist/$name.tar.gz" | cut -f1) packed, $(du -sh "$app" | cut -f1) unpacked)"
