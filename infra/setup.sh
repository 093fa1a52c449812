#!/usr/bin/env bash
# Installs what the project needs on a fresh machine: Debian packages (a Java runtime for Spark,
# Chromium for the UI checks), a Python 3.11 virtual environment, and the pinned packages of
# pyproject.toml.
set -euo pipefail
VENV="${1:-.venv}"
cd "$(dirname "$0")/.."

# Debian packages: a Java runtime for Spark, Chromium for the console's UI checks, curl.
APT=()
command -v java >/dev/null 2>&1 || APT+=(openjdk-17-jre-headless)
command -v chromium >/dev/null 2>&1 || APT+=(chromium)
command -v curl >/dev/null 2>&1 || APT+=(curl)
if [ "${#APT[@]}" -gt 0 ]; then
  echo "setup: installing ${APT[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${APT[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade "pip==26.3"
"$VENV/bin/python" -m pip install -q -e ".[dagster,kafka,dev,bench]"
echo "setup: ready ($("$VENV/bin/python" --version), $(java -version 2>&1 | head -1))"
