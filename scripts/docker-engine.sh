#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io and start dockerd when needed.
# The daemon is started the way this project needs it: no default bridge, and an address pool
# in 198.18.0.0/15 (the range reserved for benchmarking) for the runs' internal networks.
# Exit 0 when a daemon answers at the end, 1 when that is impossible here (and say why).
set -u
log=${DOCKERD_LOG:-/tmp/edge-emulator-dockerd.log}

if docker info >/dev/null 2>&1; then
  echo "docker: a daemon already answers"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "docker: no daemon answers and this is not root: start Docker yourself, or the run falls back to the local backend"
  exit 1
fi
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  echo "docker: installing ${missing[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null || { echo "docker: apt-get install failed"; exit 1; }
fi
echo "docker: starting dockerd (--bridge=none, pool 198.18.0.0/15), log in $log"
setsid dockerd --bridge=none --default-address-pool base=198.18.0.0/15,size=24 >"$log" 2>&1 < /dev/null &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "docker: daemon up"
    exit 0
  fi
  sleep 1
done
echo "docker: dockerd did not come up; last lines of $log:"
tail -n 20 "$log"
exit 1
