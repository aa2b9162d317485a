#!/usr/bin/env sh
# Add Brisk to the desktop's application menu, pointing at this unpacked folder.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
apps=${XDG_DATA_HOME:-$HOME/.local/share}/applications
icons=${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/scalable/apps
mkdir -p "$apps" "$icons"
cp "$here/brisk.svg" "$icons/brisk.svg"
sed "s|^Exec=.*|Exec=\"$here/brisk-app\"|" "$here/brisk.desktop" > "$apps/brisk.desktop"
echo "Brisk is in your application menu ($apps/brisk.desktop)."
