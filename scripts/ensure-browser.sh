#!/usr/bin/env bash
# The dashboard's browser tests drive Debian's Chromium (Playwright cannot download browsers
# here). Installs it with apt when it is missing; does nothing when it is there.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium is missing and there is no apt-get: install Chromium to run the dashboard tests" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
echo "installing chromium (apt)..." >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
