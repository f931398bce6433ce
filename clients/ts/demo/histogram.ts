/**
 * Echo round trips: the last samples, their percentiles, and a histogram drawn on a
 * canvas with log-scale buckets (0.25 ms doubling to 64 ms, then "more").
 */

/** Samples kept for the percentiles and the histogram. */
const WINDOW = 1_000;
const BUCKET_TOPS_MS = [0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, Number.POSITIVE_INFINITY];

export class Latencies {
  private readonly samples: number[] = [];
  private next = 0;
  total = 0;

  add(ms: number): void {
    if (this.samples.length < WINDOW) this.samples.push(ms);
    else this.samples[this.next] = ms;
    this.next = (this.next + 1) % WINDOW;
    this.total += 1;
  }

  /** The `p`th percentile (0..100) of the window, in ms; NaN with no samples. */
  percentile(p: number): number {
    if (this.samples.length === 0) return Number.NaN;
    const sorted = [...this.samples].sort((a, b) => a - b);
    const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
    return sorted[rank]!;
  }

  buckets(): number[] {
    const counts = BUCKET_TOPS_MS.map(() => 0);
    for (const ms of this.samples) {
      const i = BUCKET_TOPS_MS.findIndex((top) => ms <= top);
      counts[i] = (counts[i] ?? 0) + 1;
    }
    return counts;
  }
}

export function drawHistogram(canvas: HTMLCanvasElement, latencies: Latencies): void {
  const ctx = canvas.getContext("2d");
  if (ctx === null) return;
  const counts = latencies.buckets();
  const max = Math.max(1, ...counts);
  const { width, height } = canvas;
  const labelHeight = 16;
  const barWidth = width / counts.length;
  ctx.clearRect(0, 0, width, height);
  ctx.font = "10px system-ui, sans-serif";
  ctx.textAlign = "center";
  counts.forEach((count, i) => {
    const barHeight = ((height - labelHeight - 4) * count) / max;
    ctx.fillStyle = "#3558c8";
    ctx.fillRect(i * barWidth + 2, height - labelHeight - barHeight, barWidth - 4, barHeight);
    ctx.fillStyle = "#1d2330";
    const top = BUCKET_TOPS_MS[i]!;
    ctx.fillText(top === Number.POSITIVE_INFINITY ? "more" : `≤${top}`, i * barWidth + barWidth / 2, height - 4);
  });
}
