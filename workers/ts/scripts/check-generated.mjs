// Regenerates src/gen/ into a temporary directory and fails if it differs from the
// committed src/gen/ (so the committed types always match proto/proto/*.proto).
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
// One directory comparison for both packages: the client SDK's, beside this one.
import { compareDirs, reportComparison } from "../../../clients/ts/scripts/compare-dirs.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const out = mkdtempSync(join(tmpdir(), "shaddock-worker-gen-"));
try {
  execFileSync("buf", ["generate", "--output", out], { cwd: root, stdio: "inherit" });
  reportComparison("src/gen", compareDirs(join(out, "src/gen"), join(root, "src/gen")), "npm run generate");
} finally {
  rmSync(out, { recursive: true, force: true });
}
