#!/usr/bin/env bash
# Install Debian's Chromium (used by the dashboard's browser tests through
# Python playwright with executable_path=/usr/bin/chromium). Idempotent: does
# nothing when /usr/bin/chromium exists. Needs root (or sudo) and apt.
set -euo pipefail

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
    echo "chromium already installed: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
    exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "install-browser: need root or sudo to apt-get install chromium" >&2; exit 1; }
    SUDO="sudo"
fi
command -v apt-get >/dev/null || { echo "install-browser: apt-get not found (Debian/Ubuntu only)" >&2; exit 1; }

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
"$CHROMIUM" --version
