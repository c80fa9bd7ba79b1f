#!/usr/bin/env bash
# The browser the explorer's end-to-end test drives: Debian's chromium (no browser download at test time).
# Skips the install when a Chromium is already there ($TFORMER_CHROMIUM, default /usr/bin/chromium) or when
# TFORMER_SKIP_BROWSER=1 (the browser test is then skipped too).
set -euo pipefail
chromium="${TFORMER_CHROMIUM:-/usr/bin/chromium}"
if [[ "${TFORMER_SKIP_BROWSER:-0}" == 1 || -x "$chromium" ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-browser: no $chromium and no apt-get; install Chromium and set TFORMER_CHROMIUM=/path/to/it," \
       "or set TFORMER_SKIP_BROWSER=1 to leave the browser test out" >&2
  exit 1
fi
sudo=""
if [[ $(id -u) != 0 ]]; then
  sudo="sudo"
fi
echo "install-browser: installing Debian's chromium (for the explorer's browser test) ..." >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
"$chromium" --version >&2
