// Worker colours: a fixed palette keyed by the worker's name, so a worker keeps its colour
// across workflows and pages. Every colour has at least 4.3:1 contrast on white (WCAG's 3:1 for
// graphics); text is never drawn in them. Red is kept for failures.

export const PALETTE = [
  '#1f77b4', // blue
  '#c55a11', // orange
  '#2b8a3e', // green
  '#7b3fb5', // purple
  '#8c564b', // brown
  '#c2338f', // magenta
  '#0f7c8c', // teal
  '#5c6b00', // olive
  '#9a6b00', // ochre
  '#4b5563', // slate
] as const;

export const FAILED = '#b42318';
/** Conductor steps: not a worker, so outside the palette (a worker keeps the same colour in a
 * workflow with recursion as in the summary's charts). */
export const CONDUCTOR_COLOUR = '#1d1d1f';

function hash(name: string): number {
  let value = 2166136261; // FNV-1a: small and stable
  for (let i = 0; i < name.length; i++) {
    value ^= name.charCodeAt(i);
    value = Math.imul(value, 16777619);
  }
  return value >>> 0;
}

/** Colours for ``names``: each its hashed slot, moved to the next free one when two collide,
 * so one legend never shows two workers in the same colour (while there are enough colours). */
export function colours(names: Iterable<string>): Map<string, string> {
  const result = new Map<string, string>();
  const taken = new Set<number>();
  for (const name of [...new Set(names)].sort()) {
    let slot = hash(name) % PALETTE.length;
    for (let tries = 0; taken.has(slot) && tries < PALETTE.length; tries++) {
      slot = (slot + 1) % PALETTE.length;
    }
    taken.add(slot);
    result.set(name, PALETTE[slot] ?? PALETTE[0]);
  }
  return result;
}
