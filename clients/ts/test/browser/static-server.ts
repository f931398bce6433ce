/**
 * Serves gateway/web/ over plain HTTP, for developing the page before a gate serves it
 * (SHADDOCK_DEMO_FROM=static): the page then reaches the gate through `?gate=`.
 * The browser test proper loads the page from the gate.
 */
import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { join } from "node:path";

const TYPES: Record<string, string> = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css" };

export async function serveStatic(dir: string): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    const path = req.url?.split("?")[0] ?? "/";
    const file = path === "/" ? "index.html" : path.slice(1);
    try {
      const body = readFileSync(join(dir, file.replace(/[^a-z.]/g, "")));
      res.writeHead(200, { "content-type": TYPES[file.slice(file.lastIndexOf("."))] ?? "application/octet-stream" });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return { url: `http://127.0.0.1:${port}/`, server };
}
