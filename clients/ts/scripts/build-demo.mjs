// Builds the demo page into gateway/web/ (the files the gate embeds): index.html,
// app.js (demo/demo.ts and the SDK, bundled and minified by esbuild) and app.css.
// `--check` builds into a temporary directory instead and fails when the committed
// bundle differs, so the build must be deterministic (no timestamps, no source maps
// with absolute paths).
import { build } from "esbuild";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { compareDirs, reportComparison } from "./compare-dirs.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const committed = join(root, "../../gateway/web");
const check = process.argv.includes("--check");

async function buildInto(out) {
  mkdirSync(out, { recursive: true });
  await build({
    entryPoints: [join(root, "demo/demo.ts")],
    outfile: join(out, "app.js"),
    bundle: true,
    format: "iife",
    platform: "browser",
    target: "es2020",
    minify: true,
    legalComments: "none",
    charset: "utf8",
    logLevel: "warning",
  });
  copyFileSync(join(root, "demo/index.html"), join(out, "index.html"));
  copyFileSync(join(root, "demo/app.css"), join(out, "app.css"));
}

if (check) {
  const out = mkdtempSync(join(tmpdir(), "shaddock-web-"));
  try {
    await buildInto(out);
    reportComparison("gateway/web", compareDirs(out, committed), "npm run build");
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
} else {
  await buildInto(committed);
  console.log(`built ${committed}: index.html app.js app.css`);
}
