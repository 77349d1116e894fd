#!/bin/sh
# Start the pinned router release on 127.0.0.1 (ROUTER_HOST: the head's cluster address at NODES>1) with the flags
# that release accepts.
# The flags are computed from polarstack's router catalog when the compose environment is rendered
# (`polarstack compose env`), so this script only assembles them.
#   ROUTER_MODULE       sglang_router.launch_router or smg.launch_router
#   ROUTER_PORT         HTTP port of the router
#   ROUTER_HOST         address to bind (unset: 127.0.0.1; set by .run/compose/<profile>.cluster.yaml at NODES>1)
#   ROUTER_WORKER_URLS  space-separated engine URLs (static registration), or empty (slime registers them)
#   ROUTER_EXTRA_ARGS   release-specific flags (--worker-startup-check-interval, --prometheus-port, ...)
set -eu
: "${ROUTER_MODULE:?set ROUTER_MODULE (rendered by polarstack compose env)}"
: "${ROUTER_PORT:?set ROUTER_PORT (rendered by polarstack compose env)}"

set -- --host "${ROUTER_HOST:-127.0.0.1}" --port "${ROUTER_PORT}"
if [ -n "${ROUTER_WORKER_URLS:-}" ]; then
    # shellcheck disable=SC2086 # one argument per URL is intended
    set -- "$@" --worker-urls ${ROUTER_WORKER_URLS}
fi
if [ -n "${ROUTER_EXTRA_ARGS:-}" ]; then
    # shellcheck disable=SC2086 # one argument per word is intended
    set -- "$@" ${ROUTER_EXTRA_ARGS}
fi
echo "polarstack-router: python -m ${ROUTER_MODULE} $*"
exec python -m "${ROUTER_MODULE}" "$@"
