#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io (scripts/system-deps.sh docker) and
# start dockerd when needed.
# The daemon is started the way this project needs it: no default bridge, and an address pool
# in 198.18.0.0/15 (the range reserved for benchmarking) for the runs' internal networks.
# Exit 0 when a daemon answers at the end, 1 when that is impossible here (and say why).
set -u
export PATH="$PATH:/usr/sbin:/sbin"
log=${DOCKERD_LOG:-/tmp/edge-emulator-dockerd.log}

if docker info >/dev/null 2>&1; then
  echo "docker: a daemon already answers"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  if [ -S /var/run/docker.sock ]; then
    echo "docker: a daemon runs but this user may not use it: run as root, or as root: usermod -aG docker $(id -un) (then log in again); until then runs fall back to the local backend"
  else
    echo "docker: no daemon answers and this is not root: as root, run scripts/docker-engine.sh (installs and starts one); until then runs fall back to the local backend"
  fi
  exit 1
fi
"$(dirname "$0")/system-deps.sh" docker
command -v dockerd >/dev/null 2>&1 || { echo "docker: no dockerd to start"; exit 1; }
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
