#!/usr/bin/env bash
# Runs a real pomelo 2.2.7 in the foreground, shaped as the seed's comparison: 1
# connector (hybridconnector, WebSocket) + 1 echo server whose handler
# `echo.echoHandler.raw` answers the body it was sent, forwarded connector -> echo over
# pomelo's RPC. For `shaddock loadtest pomelo-compare --pomelo-url ws://127.0.0.1:PORT`.
#
#   scripts/pomelo-peer.sh [CLIENT_PORT]      (default 3010)
#
# pomelo is installed from npm into $POMELO_PEER_DIR (default a directory under
# ${TMPDIR:-/tmp}) on first use. Pomelo's master spawns the servers as child processes:
# run this script as its own process group (setsid) and stop it with
# `kill -- -PGID`, which ends all of them.
set -euo pipefail

client_port="${1:-3010}"
dir="${POMELO_PEER_DIR:-${TMPDIR:-/tmp}/shaddock-pomelo-peer}"
mkdir -p "$dir/config" "$dir/app/servers/echo/handler" "$dir/logs"
cd "$dir"

if [ ! -d node_modules/pomelo ]; then
  [ -f package.json ] || echo '{"name":"shaddock-pomelo-peer","private":true}' > package.json
  npm install --no-audit --no-fund pomelo@2.2.7 >&2
fi

cat > app.js <<'JS'
var pomelo = require('pomelo');
var app = pomelo.createApp();
app.set('name', 'shaddock-pomelo-peer');
app.configure('production|development', 'connector', function () {
  app.set('connectorConfig', {
    connector: pomelo.connectors.hybridconnector,
    heartbeat: 10,
    useDict: false,
    useProtobuf: false
  });
});
app.start();
process.on('uncaughtException', function (err) {
  console.error(' Caught exception: ' + err.stack);
});
JS

cat > app/servers/echo/handler/echoHandler.js <<'JS'
module.exports = function (app) { return new Handler(app); };
var Handler = function (app) { this.app = app; };
// Answers the body it was sent, as the seed's echo server.
Handler.prototype.raw = function (msg, session, next) { next(null, msg); };
JS

cat > config/master.json <<JSON
{ "development": { "id": "master-server-1", "host": "127.0.0.1", "port": 3005 } }
JSON

cat > config/servers.json <<JSON
{ "development": {
    "connector": [ { "id": "connector-server-1", "host": "127.0.0.1", "port": 4050,
                     "clientHost": "127.0.0.1", "clientPort": $client_port, "frontend": true } ],
    "echo": [ { "id": "echo-server-1", "host": "127.0.0.1", "port": 4060 } ]
} }
JSON

cat > config/adminServer.json <<'JSON'
[ { "type": "connector", "token": "agarxhqb98rpajloaxn34ga8xrunpagkjwlaw3ruxnpaagl29w4rxn" },
  { "type": "echo", "token": "agarxhqb98rpajloaxn34ga8xrunpagkjwlaw3ruxnpaagl29w4rxn" } ]
JSON

# Warnings only: per-message logging alone cost most of the throughput in the seed's
# runs, and Shaddock logs nothing per message either.
cat > config/log4js.json <<'JSON'
{ "appenders": [ { "type": "console" } ], "levels": { "[all]": "WARN" }, "replaceConsole": false, "lineDebug": false }
JSON

echo "pomelo 2.2.7 on node $(node --version): connector ws://127.0.0.1:$client_port" >&2
exec node app.js env=development
