/**
 * The tally service: a keyed per-key counter, the smallest service with state that
 * moves (docs/workers.md, "Keyed services"). `tally.add` (raw) counts one more for the
 * request's key and answers `"<worker name> <count>"`, so a client sees which worker
 * answered and whether a count was lost or repeated.
 *
 * Its keys spread over `TALLY_PARTITIONS` partitions. When a partition moves, and to
 * its standby after every batch that changed it (docs/workers.md, "Standbys"), its
 * counts travel as text, one line per key, `<key>=<count>\n` (the Rust tally of
 * `tests/mixed_keyed.rs` writes and reads the same), so TypeScript and Rust workers
 * hand partitions to each other. The count is after the key's last `=`; a key holding a
 * newline cannot be carried (none of the test's do).
 */
import { HandlerError } from "../errors.js";
import { partitionOf } from "../ownership.js";
import { Service } from "../service.js";

/** The tally service's name: its subject token and queue group. */
export const TALLY = "tally";
/** The partitions its keys spread over: every worker of the service says the same. */
export const TALLY_PARTITIONS = 8;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The counts as they travel between workers: `<key>=<count>\n` per key. */
export function encodeCounts(counts: Iterable<readonly [string, number]>): Uint8Array {
  let text = "";
  for (const [key, count] of counts) text += `${key}=${count}\n`;
  return encoder.encode(text);
}

/** The counts `encodeCounts` wrote; throws on a line that is not `<key>=<count>`. */
export function decodeCounts(state: Uint8Array): Map<string, number> {
  const counts = new Map<string, number>();
  for (const line of decoder.decode(state).split("\n")) {
    if (line === "") continue;
    const at = line.lastIndexOf("=");
    const count = Number(line.slice(at + 1));
    if (at < 0 || !Number.isSafeInteger(count) || count < 0) {
      throw new Error(`a tally state line that is not <key>=<count>: ${JSON.stringify(line)}`);
    }
    counts.set(line.slice(0, at), count);
  }
  return counts;
}

/** The counts of `partition`'s keys. */
function countsOf(counts: ReadonlyMap<string, number>, partition: number): [string, number][] {
  return [...counts].filter(([key]) => partitionOf(key, TALLY_PARTITIONS) === partition);
}

/** What a tally worker has seen of its partitions' moves. */
export interface TallyStats {
  /** Partitions taken with no state (nobody held them, or their holder died). */
  fresh: number;
  /** Partitions taken with counts: handed over by a peer (or kept after a refusal), or a dead owner's replica. */
  handed: number;
}

/** The tally service of a worker that answers as `name`; `stats` counts its take-overs. */
export function tallyService(name: string, stats: TallyStats = { fresh: 0, handed: 0 }): Service {
  const counts = new Map<string, number>();
  return new Service(TALLY)
    .keyed({
      partitions: TALLY_PARTITIONS,
      // After the partition's last request here: its keys' counts, forgotten here.
      handOver: (_ctx, partition) => {
        const leaving = countsOf(counts, partition);
        for (const [key] of leaving) counts.delete(key);
        return encodeCounts(leaving);
      },
      // After every batch that changed the partition: its keys' counts, kept here.
      snapshot: (partition) => encodeCounts(countsOf(counts, partition)),
      // Before the partition's first request here.
      takeOver: (_ctx, _partition, state) => {
        if (state === undefined) {
          stats.fresh += 1;
          return;
        }
        stats.handed += 1;
        for (const [key, count] of decodeCounts(state)) counts.set(key, count);
      },
    })
    .rawMethod("add", (ctx) => {
      const key = ctx.key;
      if (key === undefined) throw HandlerError.badRequest("tally.add counts per key: give one");
      const count = (counts.get(key) ?? 0) + 1;
      counts.set(key, count);
      return `${name} ${count}`;
    });
}
