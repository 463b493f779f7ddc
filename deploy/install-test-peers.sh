#!/usr/bin/env bash
# Installs the outside peers the test suite talks to (docs/interop.md); `make install-test` runs it.
#
# Pipecat (docs/interop.md) goes into its own virtualenv, .venv-pipecat, so that its many
# dependencies never mix with the gateway's .venv. It is pinned, and installed once: a stamp file
# records what was installed, and a second run with the same pins returns at once.
#
# Exit codes: under CI=true a peer that cannot be installed fails the run (exit 1), because its
# tests would otherwise have nothing to run against. Elsewhere a failed install only warns (exit 0)
# and the interop tests skip, naming this script.
#
# Environment: PYTHON (the interpreter for the new venv, >= 3.11; default python3.11 or python3),
# PIPECAT_VENV (default .venv-pipecat, relative to the repo root).
# sipp (Debian sip-tester), baresip and chromium are installed with apt-get when missing.
set -euo pipefail

cd "$(dirname "$0")/.."

PIPECAT_VENV="${PIPECAT_VENV:-.venv-pipecat}"
# The pins. pipecat-ai's "websocket" extra brings FastAPI for FastAPIWebsocketTransport; uvicorn
# serves the app and is in no Pipecat extra but "runner" (which also pulls a web UI we don't need).
PIPECAT_REQUIREMENTS=(
  "pipecat-ai[websocket]==1.14.0"
  "fastapi==0.165.0"
  "uvicorn==0.54.0"
)
STAMP="$PIPECAT_VENV/.installed-peers"

ci() {
  case "${CI:-}" in
    true | TRUE | True | 1 | yes) return 0 ;;
    *) return 1 ;;
  esac
}

fail() {
  echo "install-test-peers: $*" >&2
  if ci; then
    echo "install-test-peers: CI=true, so a missing peer fails the run" >&2
    exit 1
  fi
  echo "install-test-peers: continuing; the interop tests will be skipped" >&2
  exit 0
}

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    echo "$PYTHON"
  elif command -v python3.11 >/dev/null 2>&1; then
    command -v python3.11
  else
    command -v python3 || true
  fi
}

install_pipecat() {
  local want have python log
  want="$(printf '%s\n' "${PIPECAT_REQUIREMENTS[@]}")"
  if [[ -x "$PIPECAT_VENV/bin/python" && -f "$STAMP" ]]; then
    have="$(cat "$STAMP")"
    if [[ "$have" == "$want" ]]; then
      return 0 # already installed with these pins
    fi
  fi

  python="$(pick_python)"
  [[ -n "$python" ]] || fail "no python3 found to create $PIPECAT_VENV"
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || fail "$python is older than 3.11, which pipecat-ai 1.14 requires"

  echo "install-test-peers: installing Pipecat into $PIPECAT_VENV (${PIPECAT_REQUIREMENTS[0]})"
  local started=$SECONDS
  rm -f "$STAMP"
  if [[ ! -x "$PIPECAT_VENV/bin/python" ]]; then
    rm -rf "$PIPECAT_VENV"
    "$python" -m venv "$PIPECAT_VENV" || fail "could not create $PIPECAT_VENV"
  fi
  log="$(mktemp)"
  # A current pip resolves Pipecat's dependency tree in about half the time of an old bundled one.
  "$PIPECAT_VENV/bin/python" -m pip install -q --upgrade pip >"$log" 2>&1 || true
  if ! "$PIPECAT_VENV/bin/python" -m pip install -q "${PIPECAT_REQUIREMENTS[@]}" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -n 40 >&2 || true
    rm -f "$log"
    fail "pip could not install ${PIPECAT_REQUIREMENTS[*]}"
  fi
  rm -f "$log"
  "$PIPECAT_VENV/bin/python" -c \
    'import fastapi, uvicorn, pipecat.serializers.twilio, pipecat.transports.websocket.fastapi' \
    2>/dev/null || fail "Pipecat was installed but does not import"
  printf '%s\n' "$want" >"$STAMP"
  echo "install-test-peers: Pipecat ready in $((SECONDS - started)) s"
}

# sipp (Debian package sip-tester) for tests/integration/test_sip_sipp.py.
install_sipp() {
  if command -v sipp >/dev/null 2>&1; then
    return 0
  fi
  if [[ "$(id -u)" != "0" ]] || ! command -v apt-get >/dev/null 2>&1; then
    fail "sipp is missing; install the Debian package sip-tester (needs root and apt-get)"
  fi
  echo "install-test-peers: installing sip-tester (sipp) with apt-get"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sip-tester; } \
    >/dev/null 2>&1; then
    fail "apt-get could not install sip-tester"
  fi
  command -v sipp >/dev/null 2>&1 || fail "sip-tester was installed but sipp is not on PATH"
}

# baresip (Debian package baresip, 1.0.0 on bookworm) for tests/integration/test_baresip.py.
# It pulls in its codec and audio modules (/usr/lib/baresip/modules); the tests run it
# headless (aufile, aubridge, sndfile, ctrl_tcp), so no sound card or sound server is needed.
install_baresip() {
  if command -v baresip >/dev/null 2>&1; then
    return 0
  fi
  if [[ "$(id -u)" != "0" ]] || ! command -v apt-get >/dev/null 2>&1; then
    fail "baresip is missing; install the Debian package baresip (needs root and apt-get)"
  fi
  echo "install-test-peers: installing baresip with apt-get"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq baresip; } \
    >/dev/null 2>&1; then
    fail "apt-get could not install baresip"
  fi
  command -v baresip >/dev/null 2>&1 || fail "baresip was installed but is not on PATH"
  [[ -f /usr/lib/baresip/modules/g722.so && -f /usr/lib/baresip/modules/ctrl_tcp.so ]] \
    || fail "baresip was installed without its modules (/usr/lib/baresip/modules)"
}

# Kamailio in front of several nodes and Redis between them (docs/scaling.md): the cluster tests.
# The Debian kamailio package carries the dispatcher, rr, sl, tm and jsonrpcs modules they use.
install_apt_peer() {
  local command="$1" package="$2"
  if command -v "$command" >/dev/null 2>&1; then
    return 0
  fi
  if [[ "$(id -u)" != "0" ]] || ! command -v apt-get >/dev/null 2>&1; then
    fail "$command is missing; install the Debian package $package (needs root and apt-get)"
  fi
  echo "install-test-peers: installing $package with apt-get"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package"; } \
    >/dev/null 2>&1; then
    fail "apt-get could not install $package"
  fi
  command -v "$command" >/dev/null 2>&1 || fail "$package was installed but $command is not on PATH"
}

install_pipecat
install_sipp
install_baresip
install_apt_peer kamailio kamailio
install_apt_peer redis-server redis-server
# SIP over TLS (docs/sip.md): Debian's sipp is built without OpenSSL, so its TCP scenarios reach
# the TLS listener through socat's OpenSSL client; tcpdump captures the RTP port in the SRTP tests.
install_apt_peer socat socat
install_apt_peer tcpdump tcpdump
# The real-browser tests of /phone and /console (docs/web.md) drive Debian's chromium with
# Playwright's client; the Python client comes with the test extras, the browser from here.
install_apt_peer chromium chromium
exit 0
