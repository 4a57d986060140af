// When each step ran: one row per step, its bar from started_at to finished_at (or now, while
// it runs); on it each attempt (provider call) as a segment, with the time it waited for the
// worker's quotas before it drawn hatched, and failed attempts in red with a cross.
import { h, s } from './dom';
import { ms } from './format';
import { CONDUCTOR_COLOUR, FAILED } from './palette';
import type { Step } from './types';

const LABEL_W = 150;
const BAR_W = 560;
const ROW_H = 26;
const AXIS_H = 24;

const at = (iso: string | null): number | null => (iso ? new Date(iso).getTime() : null);

export function timeline(steps: Step[], colourOf: Map<string, string>, onSelect: (index: number) => void): HTMLElement {
  const now = Date.now();
  const spans = steps.map((step) => {
    const begin = at(step.started_at);
    const waits = step.attempts.map((a) => (at(a.started_at) ?? now) - a.quota_wait_ms);
    const start = Math.min(begin ?? Infinity, ...waits);
    const end = at(step.finished_at) ?? (begin !== null ? now : null);
    return { step, start: Number.isFinite(start) ? start : null, end };
  });
  const started = spans.filter((span) => span.start !== null);
  if (!started.length) return h('p', { class: 'muted' }, 'No step has started yet.');
  const t0 = Math.min(...started.map((span) => span.start!));
  const t1 = Math.max(...started.map((span) => Math.max(span.end ?? span.start!, span.start!)));
  const total = Math.max(t1 - t0, 1);
  const x = (t: number) => LABEL_W + ((t - t0) / total) * BAR_W;
  const width = LABEL_W + BAR_W + 16;
  const height = AXIS_H + steps.length * ROW_H + 4;

  const svg = s('svg', {
    class: 'timeline',
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: 'img',
    'aria-label': `Timeline of ${steps.length} steps over ${ms(total)}; each step's attempts are listed in its details`,
  });
  svg.append(
    s(
      'defs',
      {},
      s(
        'pattern',
        { id: 'quota-hatch', width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
        s('rect', { width: 6, height: 6, fill: '#fde68a' }),
        s('line', { x1: 0, y1: 0, x2: 0, y2: 6, stroke: '#92400e', 'stroke-width': 2 }),
      ),
    ),
  );
  for (let i = 0; i <= 4; i++) {
    const tx = LABEL_W + (BAR_W * i) / 4;
    svg.append(
      s('line', { x1: tx, y1: AXIS_H - 6, x2: tx, y2: height, class: 'tick' }),
      s('text', { x: tx, y: AXIS_H - 10, class: 'tick-label', 'text-anchor': i === 0 ? 'start' : i === 4 ? 'end' : 'middle' }, ms((total * i) / 4)),
    );
  }
  spans.forEach(({ step, start, end }, row) => {
    const y = AXIS_H + row * ROW_H;
    const colour = step.kind === 'conductor' ? CONDUCTOR_COLOUR : (colourOf.get(step.worker) ?? CONDUCTOR_COLOUR);
    const group = s(
      'g',
      { class: 'timeline-step', 'data-step': step.index, 'data-status': step.status },
      s('title', {}, `Step ${step.index} (${step.worker}): ${step.status}, ${ms(step.latency_ms)}`),
      s('text', { x: 4, y: y + 17, class: 'timeline-label' }, `#${step.index} ${step.worker.slice(0, 16)}`),
    );
    if (start !== null) {
      const stop = end ?? start;
      group.append(
        s('rect', { x: x(start), y: y + 5, width: Math.max(x(stop) - x(start), 2), height: ROW_H - 10, class: 'step-span', stroke: colour }),
      );
    }
    for (const attempt of step.attempts) {
      const begin = at(attempt.started_at);
      if (begin === null) continue;
      const failed = attempt.status === 'error';
      const finish = attempt.latency_ms > 0 ? begin + attempt.latency_ms : (at(step.finished_at) ?? now);
      if (attempt.quota_wait_ms > 0) {
        group.append(
          s('rect', {
            class: 'quota-wait',
            'data-attempt': attempt.number,
            x: x(begin - attempt.quota_wait_ms),
            y: y + 7,
            width: Math.max(x(begin) - x(begin - attempt.quota_wait_ms), 2),
            height: ROW_H - 14,
            fill: 'url(#quota-hatch)',
            stroke: '#92400e',
          }),
        );
      }
      const segment = s('rect', {
        class: 'attempt',
        'data-attempt': attempt.number,
        'data-status': attempt.status,
        x: x(begin),
        y: y + 7,
        width: Math.max(x(finish) - x(begin), 2),
        height: ROW_H - 14,
        fill: failed ? FAILED : colour,
      });
      group.append(segment);
      if (failed) {
        group.append(s('text', { x: x(begin) + 2, y: y + 6, class: 'attempt-failed', fill: FAILED }, '✗'));
      }
    }
    group.addEventListener('click', () => onSelect(step.index));
    svg.append(group);
  });
  const key = h(
    'ul',
    { class: 'legend', 'aria-label': 'Timeline legend' },
    h('li', {}, s('svg', { width: 14, height: 14, 'aria-hidden': 'true', class: 'swatch' }, s('rect', { width: 14, height: 14, fill: 'url(#quota-hatch)', stroke: '#92400e' })), 'Waiting for quota'),
    h('li', {}, s('svg', { width: 14, height: 14, 'aria-hidden': 'true', class: 'swatch' }, s('rect', { width: 14, height: 14, fill: FAILED })), '✗ Failed attempt'),
    h('li', {}, 'Outline: the step, start to finish; filled: its provider calls'),
  );
  return h('div', {}, h('div', { class: 'scroll', tabindex: 0, role: 'region', 'aria-label': 'Step timeline' }, svg), key);
}
