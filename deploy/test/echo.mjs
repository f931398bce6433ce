// One echo request through a gate: `node echo.mjs URL` expects the text back;
// `node echo.mjs URL CODE` expects the request to fail with that status code (e.g. 408
// while the echo workers are paused: the gate's own timeout, not the client's).
import { connect, echo, ShaddockError } from "./sdk.mjs";

// Longer than the gate's request timeout, so a 408 is the gate's answer.
const CLIENT_TIMEOUT_MS = 15_000;
const [url, expectCode] = process.argv.slice(2);
if (!url) {
  console.error("usage: node echo.mjs URL [EXPECTED_CODE]");
  process.exit(2);
}
const client = await connect(url, { requestTimeoutMs: CLIENT_TIMEOUT_MS, reconnect: false });
const body = `hello ${process.pid}`;
try {
  const answer = new TextDecoder().decode(await echo(client).echo(body));
  if (expectCode || answer !== body) {
    console.error(`FAIL  echo on ${url}: answered ${JSON.stringify(answer)}, expected ${expectCode ?? JSON.stringify(body)}`);
    process.exit(1);
  }
  console.log(`ok    echo on ${url}: ${JSON.stringify(answer)}`);
} catch (err) {
  if (!(err instanceof ShaddockError) || String(err.code) !== expectCode) throw err;
  console.log(`ok    echo on ${url}: ${err.code} ${err.message}, as expected`);
} finally {
  client.close();
}
