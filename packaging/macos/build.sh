#!/usr/bin/env bash
# Build Brisk.app and dist/Brisk-<version>-macos-arm64.dmg on an Apple silicon Mac.
# UNVERIFIED: written and checked on Linux only (see packaging/macos/NOTES.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=${BRISK_BUNDLE_WORK:-$root/build/macos}
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' engine/version.py)

rm -rf "$work/dist" "$work/pyi" "$work/prebuilt" "$work/Brisk.iconset"
mkdir -p "$work" dist
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q "$root[gui]" "pyinstaller==6.22.3"

# arm64 kernels, or none: on Metal MLX's own kernels do the work, and a Mac whose kernels did
# not build still gets a working app (kernels/prebuilt.py finds no manifest and says so).
if ! "$work/venv/bin/python" packaging/build_kernels.py --out "$work/prebuilt" >"$work/kernels.log" 2>&1; then
    echo "warning: the native kernels did not build (see $work/kernels.log); the app ships without them" >&2
    rm -rf "$work/prebuilt" && mkdir -p "$work/prebuilt"
    echo "No prebuilt kernels: their build failed when this bundle was made." >"$work/prebuilt/README.txt"
fi
"$work/venv/bin/python" packaging/make_iconset.py "$work/Brisk.iconset"
iconutil -c icns "$work/Brisk.iconset" -o "$work/Brisk.icns"

BRISK_ROOT=$root BRISK_PREBUILT=$work/prebuilt BRISK_ICNS=$work/Brisk.icns \
    "$work/venv/bin/pyinstaller" --noconfirm --log-level WARN --distpath "$work/dist" --workpath "$work/pyi" \
    packaging/macos/Brisk.spec

# With BRISK_CODESIGN_IDENTITY set, PyInstaller signed every binary; sign the bundle as a
# whole with the hardened runtime (notarization requires it).
if [ -n "${BRISK_CODESIGN_IDENTITY:-}" ]; then
    codesign --force --deep --options runtime --timestamp --entitlements packaging/macos/entitlements.plist \
        --sign "$BRISK_CODESIGN_IDENTITY" "$work/dist/Brisk.app"
fi

dmg="dist/Brisk-$version-macos-arm64.dmg"
rm -f "$dmg"
hdiutil create -volname "Brisk $version" -srcfolder "$work/dist/Brisk.app" -fs HFS+ -format UDZO "$dmg"

# Notarize (needs an Apple developer account; BRISK_NOTARY_PROFILE made with
# `xcrun notarytool store-credentials`), then staple the ticket to the DMG.
if [ -n "${BRISK_NOTARY_PROFILE:-}" ]; then
    xcrun notarytool submit "$dmg" --keychain-profile "$BRISK_NOTARY_PROFILE" --wait
    xcrun stapler staple "$dmg"
fi
echo "built $dmg"
