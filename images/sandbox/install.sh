#!/bin/sh
# Install the sandbox built into this image into the models volume (SANDBOX_DIR, default /models/apptainer):
# polarstack-code.sif and agent-cli/, each replaced atomically, then polarstack-sandbox.json recording what is
# there. `make up` and `make train` look for the SIF and agent-cli/bin/claude and name whichever is missing.
set -eu
src=/opt/polarstack-sandbox
dest="${SANDBOX_DIR:-/models/apptainer}"
mkdir -p "$dest"
cp "$src/polarstack-code.sif" "$dest/.polarstack-code.sif.tmp"
mv "$dest/.polarstack-code.sif.tmp" "$dest/polarstack-code.sif"
rm -rf "$dest/.agent-cli.tmp"
cp -a "$src/agent-cli" "$dest/.agent-cli.tmp"
rm -rf "$dest/agent-cli"
mv "$dest/.agent-cli.tmp" "$dest/agent-cli"
node_version="$("$dest/agent-cli/bin/node" --version)"
cli_version="$("$dest/agent-cli/bin/claude" --version | head -n 1)"
sif_sha256="$(cut -d' ' -f1 "$src/polarstack-code.sif.sha256")"
sif_bytes="$(wc -c < "$dest/polarstack-code.sif" | tr -d ' ')"
cli_bytes="$(du -sb "$dest/agent-cli" | cut -f1)"
printf '{"sif": "%s", "sif_sha256": "%s", "sif_bytes": %s, "agent_cli_dir": "%s", "agent_cli_bytes": %s, "agent_cli": "%s", "agent_cli_version_output": "%s", "node": "%s", "apptainer": "%s"}\n' \
    "$dest/polarstack-code.sif" "$sif_sha256" "$sif_bytes" "$dest/agent-cli" "$cli_bytes" "${AGENT_CLI:-}" \
    "$cli_version" "$node_version" "${APPTAINER_RELEASE:-}" > "$dest/polarstack-sandbox.json"
echo "polarstack-sandbox: installed $dest/polarstack-code.sif ($sif_bytes bytes) and $dest/agent-cli ($cli_bytes bytes; $cli_version, node $node_version)"
