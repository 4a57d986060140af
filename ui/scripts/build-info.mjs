// Writes build-info.json next to the built viewer: the SHA-256 of the sources it was built
// from. scripts/check_ui_assets.py (run by CI, no Node needed) recomputes the same digest and
// fails when the sources changed since the last `npm run build`.
//
// The digest: every regular file under ui/ except the node_modules and dist folders, sorted by
// its path relative to ui/ (UTF-8 bytes, "/" separators); for each, the line
// `<path>\0<sha256 hex of its content, CRLF read as LF>\n`; the SHA-256 of those lines.
// Keep the two implementations in step.
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const ui = fileURLToPath(new URL('..', import.meta.url));
const out = fileURLToPath(
  new URL('../../services/api/conductor_api/ui/static/build-info.json', import.meta.url),
);
const SKIPPED = new Set(['node_modules', 'dist']);

function walk(dir, found) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (!SKIPPED.has(entry.name)) walk(path, found);
    } else if (entry.isFile()) {
      found.push(relative(ui, path).split(sep).join('/'));
    }
  }
  return found;
}

const files = walk(ui, []).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
const digest = createHash('sha256');
for (const path of files) {
  const text = readFileSync(join(ui, path)).toString('latin1').replaceAll('\r\n', '\n');
  const content = createHash('sha256').update(Buffer.from(text, 'latin1')).digest('hex');
  digest.update(`${path}\0${content}\n`, 'utf8');
}
const info = {
  sources_sha256: digest.digest('hex'),
  files: files.length,
  check: 'python scripts/check_ui_assets.py',
};
writeFileSync(out, `${JSON.stringify(info, null, 2)}\n`);
console.log(`build-info.json: ${files.length} source files, sha256 ${info.sources_sha256}`);
