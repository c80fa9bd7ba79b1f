#!/usr/bin/env bash
# The speech synthesiser that builds the spoken test corpus (tformer data spoken): Debian's espeak-ng, no
# download at test time. Skips the install when espeak-ng is already there or when TFORMER_SKIP_ESPEAK=1 (the
# tests that synthesise speech are then skipped, saying why).
set -euo pipefail
if [[ "${TFORMER_SKIP_ESPEAK:-0}" == 1 ]] || command -v espeak-ng >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install-espeak: no espeak-ng and no apt-get; install espeak-ng (macOS: brew install espeak-ng)," \
       "or set TFORMER_SKIP_ESPEAK=1 to leave the spoken-corpus tests out" >&2
  exit 1
fi
sudo=""
if [[ $(id -u) != 0 ]]; then
  sudo="sudo"
fi
echo "install-espeak: installing Debian's espeak-ng (for the spoken-corpus tests) ..." >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends espeak-ng >/dev/null
espeak-ng --version >&2
