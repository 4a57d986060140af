// The plan as a graph: dagre lays it out, the SVG is drawn here. One node per step, one edge
// per step it could see (visible_steps: access lists with "all" already expanded), one box per
// round of recursion. Left to right: steps that depend on nothing between them share a column.
import dagre from '@dagrejs/dagre';
import { h, s } from './dom';
import { firstLine } from './format';
import { CONDUCTOR_COLOUR, FAILED } from './palette';
import type { Step } from './types';

const NODE_W = 168;
const NODE_H = 52;
const ROUND_LABEL_H = 22; // room above each round's nodes for its label

const STATUS_MARK: Record<Step['status'], string> = {
  pending: '○ pending',
  running: '◐ running',
  succeeded: '✓ succeeded',
  failed: '✗ failed',
  cancelled: '⊘ cancelled',
};

interface Box {
  x: number;
  y: number;
  width: number;
  height: number;
}

function curve(points: { x: number; y: number }[]): string {
  // Through the midpoints, with dagre's bend points as controls: smooth, and still ends on the
  // node borders dagre computed.
  const [first, ...rest] = points;
  if (!first) return '';
  let d = `M${first.x},${first.y}`;
  for (let i = 0; i < rest.length - 1; i++) {
    const p = rest[i]!;
    const q = rest[i + 1]!;
    d += ` Q${p.x},${p.y} ${(p.x + q.x) / 2},${(p.y + q.y) / 2}`;
  }
  const last = rest[rest.length - 1];
  if (last) d += ` L${last.x},${last.y}`;
  return d;
}

function hexagon(width: number, height: number): string {
  const cut = 14;
  return [
    [cut, 0],
    [width - cut, 0],
    [width, height / 2],
    [width - cut, height],
    [cut, height],
    [0, height / 2],
  ]
    .map(([x, y]) => `${x},${y}`)
    .join(' ');
}

export function planGraph(
  steps: Step[],
  colourOf: Map<string, string>,
  selected: number | null,
  onSelect: (index: number) => void,
): SVGSVGElement {
  const graph = new dagre.graphlib.Graph({ compound: true });
  graph.setGraph({ rankdir: 'LR', nodesep: 40, ranksep: 56, marginx: 12, marginy: 12 + ROUND_LABEL_H });
  graph.setDefaultEdgeLabel(() => ({}));
  const rounds = [...new Set(steps.map((step) => step.round))].sort((a, b) => a - b);
  for (const round of rounds) graph.setNode(`round-${round}`, {});
  const known = new Set(steps.map((step) => step.index));
  for (const step of steps) {
    graph.setNode(`step-${step.index}`, { width: NODE_W, height: NODE_H });
    graph.setParent(`step-${step.index}`, `round-${step.round}`);
  }
  const edges: [number, number][] = [];
  for (const step of steps) {
    for (const from of step.visible_steps) {
      if (!known.has(from) || from === step.index) continue;
      edges.push([from, step.index]);
      graph.setEdge(`step-${from}`, `step-${step.index}`);
    }
  }
  // A later round follows the Conductor step that asked for it, even where none of its steps
  // reads that step: a layout-only edge keeps the rounds in order (it is not drawn).
  for (const [position, round] of rounds.entries()) {
    const next = rounds[position + 1];
    if (next === undefined) break;
    const handOver = steps.filter((st) => st.round === round && st.kind === 'conductor');
    const sources = handOver.length ? handOver : steps.filter((st) => st.round === round);
    for (const step of steps.filter((st) => st.round === next)) {
      for (const source of sources) {
        if (!graph.hasEdge(`step-${source.index}`, `step-${step.index}`)) {
          graph.setEdge(`step-${source.index}`, `step-${step.index}`, { layoutOnly: true });
        }
      }
    }
  }
  dagre.layout(graph);

  const size = graph.graph();
  const width = Math.ceil(size.width ?? NODE_W);
  const height = Math.ceil(size.height ?? NODE_H);
  const svg = s('svg', {
    class: 'plan-graph',
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: 'group',
    'aria-label': `Plan graph: ${steps.length} steps in ${rounds.length} round(s)`,
  });
  svg.append(
    s(
      'defs',
      {},
      s(
        'marker',
        { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
        s('path', { d: 'M0,0 L10,5 L0,10 z', fill: '#4b5563' }),
      ),
    ),
  );

  for (const round of rounds) {
    const box = graph.node(`round-${round}`) as Box;
    const top = box.y - box.height / 2 - ROUND_LABEL_H;
    svg.append(
      s(
        'g',
        { class: 'round', 'data-round': round },
        s('rect', { x: box.x - box.width / 2, y: top, width: box.width, height: box.height + ROUND_LABEL_H, rx: 8, class: 'round-box' }),
        s('text', { x: box.x - box.width / 2 + 10, y: top + 15, class: 'round-label' }, `Round ${round}`),
      ),
    );
  }

  for (const [from, to] of edges) {
    const points = graph.edge(`step-${from}`, `step-${to}`).points ?? [];
    svg.append(
      s('path', { class: 'access-edge', 'data-from': from, 'data-to': to, d: curve(points), 'marker-end': 'url(#arrow)' }),
    );
  }

  for (const step of steps) {
    const box = graph.node(`step-${step.index}`) as Box;
    const conductor = step.kind === 'conductor';
    const colour = conductor ? CONDUCTOR_COLOUR : (colourOf.get(step.worker) ?? CONDUCTOR_COLOUR);
    const isSelected = step.index === selected;
    const saw = step.visible_steps.length ? `saw steps ${step.visible_steps.join(', ')}` : 'saw only the question';
    const label = `Step ${step.index}, ${conductor ? 'Conductor step' : `worker ${step.worker}`}, ${step.status}, ${saw}`;
    const shapeAttrs = {
      class: 'node-shape',
      fill: '#ffffff',
      stroke: colour,
      'stroke-width': 3,
      'stroke-dasharray': step.status === 'pending' ? '6 4' : null,
    };
    const shape = conductor
      ? s('polygon', { points: hexagon(NODE_W, NODE_H), ...shapeAttrs })
      : s('rect', { width: NODE_W, height: NODE_H, rx: 6, ...shapeAttrs });
    const node = s(
      'g',
      {
        class: `step-node${isSelected ? ' selected' : ''}`,
        'data-step': step.index,
        'data-worker': step.worker,
        'data-kind': step.kind,
        'data-status': step.status,
        transform: `translate(${box.x - NODE_W / 2},${box.y - NODE_H / 2})`,
        tabindex: 0,
        role: 'button',
        'aria-pressed': isSelected ? 'true' : 'false',
        'aria-label': label,
      },
      s('title', {}, `${label}: ${firstLine(step.subtask, 200)}`),
      s('rect', { class: 'node-outline', x: -5, y: -5, width: NODE_W + 10, height: NODE_H + 10, rx: 9 }),
      shape,
      conductor ? null : s('rect', { x: 0, y: 0, width: 8, height: NODE_H, fill: colour, rx: 3 }),
      s('text', { x: conductor ? 20 : 16, y: 22, class: 'node-title' }, `#${step.index} ${conductor ? 'Conductor' : firstLine(step.worker, 16)}`),
      s(
        'text',
        { x: conductor ? 20 : 16, y: 40, class: 'node-status', fill: step.status === 'failed' ? FAILED : '#374151' },
        STATUS_MARK[step.status],
      ),
    );
    node.addEventListener('click', () => onSelect(step.index));
    node.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        onSelect(step.index);
      }
    });
    svg.append(node);
  }
  return svg;
}

/** The worker colours and the shapes, as a list under the graph (``colourOf``: workers only). */
export function legend(colourOf: Map<string, string>, hasConductor: boolean): HTMLElement {
  const swatch = (colour: string) =>
    s('svg', { width: 14, height: 14, 'aria-hidden': 'true', class: 'swatch' }, s('rect', { width: 14, height: 14, rx: 3, fill: colour }));
  return h(
    'ul',
    { class: 'legend', 'aria-label': 'Legend' },
    [...colourOf].map(([worker, colour]) => h('li', { 'data-worker': worker }, swatch(colour), worker)),
    hasConductor
      ? h(
          'li',
          {},
          s('svg', { width: 20, height: 14, 'aria-hidden': 'true', class: 'swatch' }, s('polygon', { points: '5,1 15,1 19,7 15,13 5,13 1,7', fill: '#ffffff', stroke: CONDUCTOR_COLOUR, 'stroke-width': 1.5 })),
          'Conductor step (hands control back to the Conductor)',
        )
      : null,
    h('li', {}, 'Arrows: the steps whose outputs a step could see'),
  );
}
