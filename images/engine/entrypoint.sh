#!/bin/sh
# Run the engine command compose gives, plus the profile's ENGINE_EXTRA_ARGS (extra sglang.launch_server flags,
# validated against the pinned sglang's own ServerArgs by `make verify-offline`).
set -eu
if [ -n "${ENGINE_EXTRA_ARGS:-}" ]; then
    # shellcheck disable=SC2086 # one argument per word is intended
    set -- "$@" ${ENGINE_EXTRA_ARGS}
fi
echo "polarstack-engine: $*"
exec "$@"
