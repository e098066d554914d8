// Copies the pinned front-end libraries (package-lock.json) into the Python package, so that the
// wheel ships them and the dashboard never loads anything from a CDN. Run: npm ci && npm run build
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const vendor = join(here, "..", "services", "dashboard", "static", "vendor");
const files = {
  "uplot/dist/uPlot.iife.min.js": "uPlot.iife.min.js",
  "uplot/dist/uPlot.min.css": "uPlot.min.css",
  "uplot/LICENSE": "uPlot.LICENSE",
};

mkdirSync(vendor, { recursive: true });
const versions = {};
for (const [from, to] of Object.entries(files)) {
  copyFileSync(join(here, "node_modules", from), join(vendor, to));
  const name = from.split("/")[0];
  versions[name] = JSON.parse(readFileSync(join(here, "node_modules", name, "package.json"))).version;
}
writeFileSync(join(vendor, "versions.json"), JSON.stringify(versions, null, 2) + "\n");
console.log(`copied ${Object.keys(files).length} files into ${vendor}:`, versions);
