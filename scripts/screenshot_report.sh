#!/usr/bin/env bash
# Render a flashrec-bench report.html to a PNG with headless Chromium, to look at its layout
# (the verdict at the top, tables that scroll instead of losing columns, legends beside the
# plots, notes in paragraphs) the way a reader's browser shows it.
#
#   scripts/screenshot_report.sh REPORT_HTML [OUT_PNG] [WIDTH] [HEIGHT]
#
# OUT_PNG defaults to REPORT_HTML with .png; WIDTH x HEIGHT is the browser window in CSS pixels
# (default 1280 x 4000: a laptop-wide window, tall enough for a whole small report).
# Chromium: `apt-get install -y chromium` (Debian) or set CHROMIUM to its binary. It runs
# offline (no network, no first-run or sync services) in a throw-away profile.
set -euo pipefail
html=${1:?usage: scripts/screenshot_report.sh REPORT_HTML [OUT_PNG] [WIDTH] [HEIGHT]}
out=${2:-${html%.html}.png}
width=${3:-1280}
height=${4:-4000}
browser=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$browser" ]; then
  echo "no Chromium found: apt-get install -y chromium, or set CHROMIUM=/path/to/chrome" >&2
  exit 2
fi
[ -f "$html" ] || { echo "no such file: $html" >&2; exit 2; }
abs=$(cd "$(dirname "$html")" && pwd)/$(basename "$html")
out_abs=$(mkdir -p "$(dirname "$out")" && cd "$(dirname "$out")" && pwd)/$(basename "$out")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run \
  --user-data-dir="$profile" --window-size="$width,$height" \
  --screenshot="$out_abs" "file://$abs" >/dev/null 2>&1
[ -s "$out_abs" ] || { echo "Chromium wrote no screenshot to $out_abs" >&2; exit 1; }
echo "$out_abs"
