// Compares two directory trees file by file; used by check:generated and check:bundle,
// here and in workers/ts.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";

function files(root, dir = root, out = new Map()) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) files(root, path, out);
    else out.set(relative(root, path), readFileSync(path));
  }
  return out;
}

/** The differences between `expected` (fresh build) and `actual` (committed), as lines. */
export function compareDirs(expected, actual) {
  const want = files(expected);
  const have = files(actual);
  const problems = [];
  for (const [name, bytes] of want) {
    const got = have.get(name);
    if (got === undefined) problems.push(`missing: ${name}`);
    else if (!got.equals(bytes)) problems.push(`differs: ${name}`);
  }
  for (const name of have.keys()) if (!want.has(name)) problems.push(`not generated (stale): ${name}`);
  return problems;
}

/** Exits non-zero with the differences, or says all is well. */
export function reportComparison(what, problems, fix) {
  if (problems.length === 0) {
    console.log(`${what} is up to date`);
    return;
  }
  console.error(`${what} is out of date (run \`${fix}\` and commit the result):`);
  for (const line of problems) console.error(`  ${line}`);
  process.exit(1);
}
