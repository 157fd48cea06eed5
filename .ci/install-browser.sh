#!/usr/bin/env bash
# Installs the browser the tests drive (tests/test_browser.py): Debian's chromium and chromium-driver.
# Idempotent: does nothing when both are already on PATH. `make test` runs it before pytest.
# (A test tool's own browser download cannot work here: only the package registries are reachable.)
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install-browser: chromium/chromedriver missing and not root (no sudo): install the Debian" >&2
    echo "packages 'chromium' and 'chromium-driver', or set CHROMIUM and CHROMEDRIVER to their paths." >&2
    exit 1
  fi
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-browser: no apt-get; install chromium and its chromedriver with your package manager." >&2
  exit 1
fi

echo "install-browser: installing chromium and chromium-driver (Debian packages)"
export DEBIAN_FRONTEND=noninteractive
for attempt in 1 2 3; do
  if $SUDO apt-get update -qq -o Acquire::Retries=3 &&
     $SUDO apt-get install -y -qq --no-install-recommends -o Acquire::Retries=3 \
       chromium chromium-driver fonts-dejavu-core >/dev/null; then
    break
  fi
  if [ "$attempt" = 3 ]; then
    echo "install-browser: apt-get failed 3 times" >&2
    exit 1
  fi
  sleep $((attempt * 10))
done
chromium --version 2>/dev/null | head -1 || true
chromedriver --version | head -1
