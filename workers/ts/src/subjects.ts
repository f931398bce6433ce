/**
 * The bus subjects of the worker contract (docs/workers.md), and the name rule that
 * keeps a service, method, group or user name from widening a NATS subject.
 */

/** The prefix gates and workers share unless configured otherwise. */
export const DEFAULT_PREFIX = "shaddock";

/** Longest service, method, group or user name: the gates bound route tokens the same. */
export const MAX_NAME_LEN = 64;

const NAME = /^[a-z0-9_-]+$/;

/** Whether `name` is one subject token of lowercase `[a-z0-9_-]`, 1 to 64 bytes. */
export function isValidName(name: string): boolean {
  return name.length > 0 && name.length <= MAX_NAME_LEN && NAME.test(name);
}

/** Whether `subject` is one or more dot-separated valid names. */
export function isValidSubject(subject: string): boolean {
  return subject.split(".").every(isValidName);
}

/** Where requests for every method of `service` arrive (queue group: the service's name). */
export function serviceSubject(prefix: string, service: string): string {
  return `${prefix}.svc.${service}.>`;
}

/** Where a gate publishes a request for route `service.method`. */
export function methodSubject(prefix: string, service: string, method: string): string {
  return `${prefix}.svc.${service}.${method}`;
}

/** A push to every member of `group`, on every gate: a `ServerPush`. */
export function groupSubject(prefix: string, group: string): string {
  return `${prefix}.grp.${group}`;
}

/** A command for player `uid`, on whichever gate holds it: a `UserCommand`. */
export function userSubject(prefix: string, uid: string): string {
  return `${prefix}.user.${uid}`;
}

/** Where a worker announces its service's `ServiceSchema`. */
export function announceSubject(prefix: string, service: string): string {
  return `${prefix}.schema.svc.${service}`;
}

/** Anything published here makes every worker announce again. */
export function askSubject(prefix: string): string {
  return `${prefix}.schema.ask`;
}

/** Where gates publish a `SessionClosed` when a session ends. */
export function sessionClosedSubject(prefix: string): string {
  return `${prefix}.evt.session.closed`;
}

/**
 * Where a keyed service's workers take requests of `partition`, with `.<method>` after
 * it: a gate publishes `<prefix>.part.<service>.<N>.<method>`, and the partition's owner
 * subscribes it plain (during a hand-over, its new owner too). Its own namespace, outside
 * `svc`: a plain worker's `<prefix>.svc.<service>.>` in the queue group never catches a
 * keyed request, which would then be answered twice.
 */
export function partitionSubject(prefix: string, service: string, partition: number): string {
  return `${prefix}.part.${service}.${partition}`;
}

/** Where a keyed service's workers say they live and what they hold (`KeyedMember`). */
export function membersSubject(prefix: string, service: string): string {
  return `${prefix}.keyed.${service}.members`;
}

/** Where worker `member` takes partitions handed over to it (`HandOver`, as a request). */
export function handoverSubject(prefix: string, service: string, member: string): string {
  return `${prefix}.keyed.${service}.handover.${member}`;
}

/**
 * Where worker `member` takes what the owners it stands by for replicate to it
 * (`Replica`, as a request; docs/workers.md, "Standbys").
 */
export function replicaSubject(prefix: string, service: string, member: string): string {
  return `${prefix}.keyed.${service}.replica.${member}`;
}
