/**
 * What a partition's old owner took during a hand-over (docs/workers.md, "Hand-over"):
 * per origin, the highest `seq` of the partition's requests, so the new owner runs only
 * the held requests its old owner did not: none lost, none run twice.
 */
import { fromBinary } from "@bufbuild/protobuf";
import { RequestOrderSchema } from "./gen/rpc_pb.js";

/** Per origin, the highest `seq` of a partition's requests its old owner took. */
export type Seen = ReadonlyMap<string, bigint>;

/** A request's origin and place in it; `undefined` without an origin (or when it does not decode). */
function orderOf(payload: Uint8Array): { origin: string; seq: bigint } | undefined {
  try {
    const { origin, seq } = fromBinary(RequestOrderSchema, payload);
    return origin === "" ? undefined : { origin, seq };
  } catch {
    return undefined;
  }
}

/** Notes the request `payload` in `seen`: its seq is its origin's highest so far. */
export function noteSeen(seen: Map<string, bigint>, payload: Uint8Array): void {
  const order = orderOf(payload);
  if (order === undefined) return;
  const highest = seen.get(order.origin);
  if (highest === undefined || order.seq > highest) seen.set(order.origin, order.seq);
}

/** Whether the old owner, which took what `seen` says, did not take the request `payload`. */
export function unseen(seen: Seen, payload: Uint8Array): boolean {
  const order = orderOf(payload);
  if (order === undefined) return true;
  const highest = seen.get(order.origin);
  return highest === undefined || order.seq > highest;
}
