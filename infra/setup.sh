#!/usr/bin/env bash
# Installs what the project needs on a fresh machine: a Java runtime for Spark (Debian package),
# a Python 3.11 virtual environment, and the pinned packages of pyproject.toml.
set -euo pipefail
VENV="${1:-.venv}"
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null 2>&1; then
  echo "setup: installing a Java runtime for Spark"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade "pip==26.3"
"$VENV/bin/python" -m pip install -q -e ".[dagster,kafka,dev]"
echo "setup: ready ($("$VENV/bin/python" --version), $(java -version 2>&1 | head -1))"
