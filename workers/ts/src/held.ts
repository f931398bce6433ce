/**
 * What a worker could not deliver (docs/workers.md, "Draining on shutdown"): the answers
 * and pushes it published while its connection was down, since the connection was last
 * made. The client holds them and writes them first thing on reconnecting; a worker
 * that gives up on its drain (its grace passed, the bus is still down) says how many
 * are lost.
 */
import type { NatsConnection } from "@nats-io/transport-node";

/** Answers and pushes not delivered. */
export interface Undelivered {
  readonly answers: number;
  readonly pushes: number;
}

export class Held {
  /** The connection is down: what is published now waits in the client until it is back. */
  #down = false;
  #answers = 0;
  #pushes = 0;

  /** Follows `nc`'s state until it closes. */
  constructor(nc: NatsConnection) {
    void this.#watch(nc);
  }

  /** An answer was just published. */
  answered(): void {
    if (this.#down) this.#answers += 1;
  }

  /** `count` pushes were just published. */
  pushed(count: number): void {
    if (this.#down) this.#pushes += count;
  }

  /** What is held now: zeros while the connection is up. */
  get undelivered(): Undelivered {
    return this.#down ? { answers: this.#answers, pushes: this.#pushes } : { answers: 0, pushes: 0 };
  }

  async #watch(nc: NatsConnection): Promise<void> {
    for await (const status of nc.status()) {
      if (status.type === "disconnect") {
        this.#down = true;
      } else if (status.type === "reconnect") {
        this.#down = false;
        this.#answers = 0;
        this.#pushes = 0;
      }
    }
  }
}
