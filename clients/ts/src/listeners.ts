/** A set of listeners: add returns the function that removes it. */
export class Listeners<Args extends unknown[]> {
  private readonly fns = new Set<(...args: Args) => void>();

  add(fn: (...args: Args) => void): () => void {
    this.fns.add(fn);
    return () => {
      this.fns.delete(fn);
    };
  }

  get size(): number {
    return this.fns.size;
  }

  /** Calls each listener; one that throws is reported and does not stop the others. */
  emit(report: (error: unknown) => void, ...args: Args): void {
    for (const fn of [...this.fns]) {
      try {
        fn(...args);
      } catch (error) {
        report(error);
      }
    }
  }
}
