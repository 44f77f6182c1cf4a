#!/usr/bin/env bash
# Install what a make target needs from outside the Python lock, where this user can: Debian
# packages with apt-get when run as root (one `apt-get update` per call), py-spy with pip into the
# venv. One line per thing asked for: already there, installed, would install (--dry-run), or
# could not install, with why and the exact command that would. Nothing missing stops the
# caller by itself: exit 1 says something is still missing (the run then falls back or adapts),
# exit 2 a name this script does not know.
#
# usage: scripts/system-deps.sh [--dry-run] THING...
#   docker                 Docker engine and what the docker backend uses: docker.io, iptables,
#                          util-linux (nsenter), debootstrap (image without a registry), iproute2
#   dataset-fashion-mnist  Fashion-MNIST IDX files in /usr/share/datasets/fashion-mnist (alias fashion-mnist)
#   chromium               headless browser for the HTML report test
#   make, python3-venv     what `make setup` itself needs
#   py-spy                 profiler for `make profile`, pip-installed into $VENV (default .venv)
set -u
export PATH="$PATH:/usr/sbin:/sbin"  # iptables and debootstrap live there; not on a user's PATH
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

# --- what each thing is: a check that prints the packages still missing, and how they install

missing_docker() {
  local pair
  for pair in dockerd:docker.io iptables:iptables nsenter:util-linux debootstrap:debootstrap ip:iproute2; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || echo "${pair#*:}"
  done
}
missing_dataset_fashion_mnist() {
  compgen -G "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte*" >/dev/null || echo dataset-fashion-mnist
}
missing_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || echo chromium
}
missing_make() { command -v make >/dev/null 2>&1 || echo make; }
missing_python3_venv() { "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1 || echo python3-venv; }
missing_py_spy() { [ -x "$VENV/bin/py-spy" ] || echo py-spy; }

declare -A ALIAS=([fashion-mnist]=dataset-fashion-mnist)
declare -A VIA=([py-spy]=pip)  # everything else: apt
KNOWN="docker dataset-fashion-mnist fashion-mnist chromium make python3-venv py-spy"

# --- installers: install_<via> PACKAGES... ; the command a user would run: command_<via> PACKAGES...

command_apt() { echo "as root: apt-get update && apt-get install -y $*"; }
command_pip() { echo "$VENV/bin/python -m pip install $*"; }

# Why apt cannot install here (empty when it can).
cannot_apt() {
  [ "$(id -u)" = 0 ] || { echo "not root"; return; }
  command -v apt-get >/dev/null 2>&1 || echo "no apt-get here (not Debian?)"
}
cannot_pip() { "$VENV/bin/python" -c '' >/dev/null 2>&1 || echo "no usable $VENV/bin/python: run make setup first"; }

# Installers set `failure` to the last line the tool printed when they fail (they run in this
# shell, not a subshell, so the one `apt-get update` per call is remembered).
updated=""
failure=""
run_logged() {
  local log rc
  log=$(mktemp)
  "$@" >"$log" 2>&1
  rc=$?
  [ $rc = 0 ] || failure=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
  rm -f "$log"
  return $rc
}
install_apt() {
  if [ -z "$updated" ]; then
    updated=1
    run_logged apt-get update -qq || echo "  (apt-get update failed: $failure; trying the package lists already here)"
  fi
  export DEBIAN_FRONTEND=noninteractive
  run_logged apt-get install -y -qq "$@"
}
install_pip() { run_logged "$VENV/bin/python" -m pip install -q "$@"; }

# --- main

dry_run=""
things=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) things+=("${ALIAS[$arg]:-$arg}") ;;
  esac
done
for thing in "${things[@]}"; do
  declare -F "missing_${thing//-/_}" >/dev/null || { echo "error: unknown thing '$thing' (known: $KNOWN)" >&2; exit 2; }
done

still_missing=0
for thing in "${things[@]}"; do
  via=${VIA[$thing]:-apt}
  packages=$("missing_${thing//-/_}" | xargs)
  if [ -z "$packages" ]; then
    echo "$thing: already there"
    continue
  fi
  why=$("cannot_$via")
  if [ -n "$dry_run" ]; then
    echo "$thing: missing $packages; would run: $("command_$via" $packages)${why:+ (but here: $why)}"
    still_missing=1
    continue
  fi
  if [ -z "$why" ]; then
    failure=""
    if "install_$via" $packages && [ -z "$("missing_${thing//-/_}")" ]; then
      echo "$thing: installed ($packages, $via)"
      continue
    fi
    why="$via failed: ${failure:-installed, but still not found}"
  fi
  echo "$thing: could not install ($why); run: $("command_$via" $packages)"
  still_missing=1
done
exit $still_missing
