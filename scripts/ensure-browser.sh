#!/usr/bin/env bash
# The dashboard's browser tests drive Debian's Chromium (through Playwright, which cannot
# download browsers here) and Firefox ESR (through WebDriver BiDi). Installs whichever is
# missing with apt; does nothing when both are there.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v firefox-esr >/dev/null 2>&1 || command -v firefox >/dev/null 2>&1 || missing+=(firefox-esr)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing ${missing[*]} and there is no apt-get: install them to run the dashboard tests" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
echo "installing ${missing[*]} (apt)..." >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
