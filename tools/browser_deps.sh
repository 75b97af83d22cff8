#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver for the browser test (tests/browser/). Idempotent: does nothing when
# both are already installed. Test tools cannot download a browser of their own here, so the system's is used.
set -euo pipefail
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
CHROMEDRIVER=${CHROMEDRIVER:-/usr/bin/chromedriver}
if [ -x "$CHROMIUM" ] && [ -x "$CHROMEDRIVER" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "browser-deps: no apt-get here; install Chromium and its ChromeDriver, then set CHROMIUM and CHROMEDRIVER" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "browser-deps: run as root, or install chromium chromium-driver" >&2; exit 1; }
    SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
echo "browser-deps: installing Debian's chromium and chromium-driver (once)"
# the package lists may be missing or stale on a fresh machine: update only when the install needs it
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver \
    || { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver; }
"$CHROMIUM" --version
"$CHROMEDRIVER" --version
