/**
 * The shop and the bank: the smallest pair of services where one calls the other
 * (docs/workers.md, "Calling other services").
 *
 * - `shop.login` (raw) binds the session to the uid in its body.
 * - `shop.buy` (raw) calls `bank.pay` with its body and answers with the bank's answer,
 *   or `no sale: <code> <message>` when the call failed (no bank, a timeout).
 * - `bank.pay` (raw) answers `<uid> paid <body>`, the uid of the session the call
 *   carried (`nobody` without one).
 *
 * The Rust shop and bank of `tests/mixed_calls.rs` answer the same, so a Rust shop calls
 * this bank and this shop a Rust bank.
 */
import { Service } from "../service.js";

/** The shop's name: its subject token and queue group. */
export const SHOP = "shop";
/** The bank's name. */
export const BANK = "bank";

const decoder = new TextDecoder();

/** The shop: `buy` calls `bank.pay` and answers with what the bank said. */
export function shopService(): Service {
  return new Service(SHOP)
    .rawMethod("login", (ctx, body) => {
      ctx.bindUid(decoder.decode(body));
      return "";
    })
    .rawMethod("buy", async (ctx, body) => {
      const paid = await ctx.call(`${BANK}.pay`, body);
      return paid.ok ? paid.body : `no sale: ${paid.code} ${paid.message}`;
    });
}

/** The bank: `pay` answers who paid (the caller's session's uid) and what. */
export function bankService(): Service {
  return new Service(BANK).rawMethod("pay", (ctx, body) => `${ctx.uid ?? "nobody"} paid ${decoder.decode(body)}`);
}
