// #/summary : GET /v1/stats over a date range: totals as figures, and charts (each with a
// visually hidden table of the same numbers, for screen readers) of workflows and cost by
// variant, tokens and cost by worker, and failure reasons.
import {
  BarController,
  BarElement,
  CategoryScale,
  Chart,
  type ChartConfiguration,
  Legend,
  LinearScale,
  Tooltip,
} from 'chart.js';
import { api, isAbort } from '../api';
import { facts, h } from '../dom';
import { dayStart, int, localDate, ms, percent, usd } from '../format';
import { colours, FAILED } from '../palette';
import type { Stats } from '../types';
import { type Page, setTitle } from './page';

Chart.register(BarController, BarElement, CategoryScale, LinearScale, Legend, Tooltip);
Chart.defaults.color = '#1d1d1f';
Chart.defaults.font.family = 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
Chart.defaults.animation = false; // redraws stay instant, and respect reduced motion

type Row = { start: string } & Record<string, string | number>;

/** Every bucket start in the span, so that the time axis has no gaps. */
function buckets(stats: Stats, rows: Row[]): string[] {
  const step = stats.bucket === 'hour' ? 3_600_000 : 86_400_000;
  const starts = new Set(rows.map((row) => Date.parse(row.start)));
  if (stats.created_after && stats.created_before) {
    const first = new Date(stats.created_after);
    first.setUTCMinutes(0, 0, 0);
    if (stats.bucket === 'day') first.setUTCHours(0);
    for (let t = first.getTime(); t < Date.parse(stats.created_before); t += step) starts.add(t);
  }
  return [...starts].sort((a, b) => a - b).map((t) => new Date(t).toISOString());
}

function bucketLabel(iso: string, bucket: Stats['bucket']): string {
  const at = new Date(iso);
  return bucket === 'hour'
    ? at.toLocaleString(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' })
    : at.toLocaleDateString(undefined, { month: 'short', day: 'numeric', timeZone: 'UTC' });
}

interface Series {
  labels: string[];
  names: string[];
  values: number[][]; // values[name][bucket]
}

function series(stats: Stats, rows: Row[], key: string, measure: string): Series {
  const starts = buckets(stats, rows);
  const names = [...new Set(rows.map((row) => String(row[key])))].sort();
  const position = new Map(starts.map((start, i) => [Date.parse(start), i]));
  const values = names.map(() => starts.map(() => 0));
  for (const row of rows) {
    const i = position.get(Date.parse(row.start));
    const n = names.indexOf(String(row[key]));
    if (i !== undefined && n >= 0) values[n]![i]! += Number(row[measure]);
  }
  return { labels: starts.map((start) => bucketLabel(start, stats.bucket)), names, values };
}

/** A chart with an accessible name, and the same numbers as a table screen readers can read. */
function chartFigure(
  charts: Chart[],
  id: string,
  title: string,
  description: string,
  config: ChartConfiguration<'bar'>,
  table: { head: string[]; rows: (string | number)[][] },
  pending: (() => void)[],
): HTMLElement {
  const canvas = h('canvas', { id, role: 'img', 'aria-label': `${title}: ${description}` });
  // Horizontal bars: a taller box when there are many (no inline style: CSP).
  const tall = config.options?.indexAxis === 'y' && (config.data.labels?.length ?? 0) > 6;
  const figure = h(
    'figure',
    { class: 'chart' },
    h('figcaption', {}, title),
    h('div', { class: tall ? 'chart-box tall' : 'chart-box' }, canvas),
    h(
      'table',
      { class: 'visually-hidden' },
      h('caption', {}, title),
      h('thead', {}, h('tr', {}, table.head.map((name) => h('th', { scope: 'col' }, name)))),
      h(
        'tbody',
        {},
        table.rows.map(([first, ...rest]) => h('tr', {}, h('th', { scope: 'row' }, first ?? ''), rest.map((v) => h('td', {}, v)))),
      ),
    ),
  );
  pending.push(() => charts.push(new Chart(canvas, config)));
  return figure;
}

function stacked(data: Series, colourOf: Map<string, string>, money: boolean): ChartConfiguration<'bar'> {
  return {
    type: 'bar',
    data: {
      labels: data.labels,
      datasets: data.names.map((name, n) => ({
        label: name,
        data: data.values[n] ?? [],
        backgroundColor: colourOf.get(name) ?? '#4b5563',
        maxBarThickness: 48,
      })),
    },
    options: {
      responsive: true,
      maintainAspectRatio: false,
      scales: {
        x: { stacked: true },
        y: { stacked: true, beginAtZero: true, ticks: money ? { callback: (v) => usd(Number(v)) } : {} },
      },
      plugins: { legend: { position: 'bottom' } },
    },
  };
}

function seriesTable(data: Series, money: boolean): { head: string[]; rows: (string | number)[][] } {
  return {
    head: ['Time', ...data.names],
    rows: data.labels.map((label, i) => [label, ...data.names.map((_, n) => (money ? usd(data.values[n]![i]!) : int(data.values[n]![i]!)))]),
  };
}

export function summaryPage(main: HTMLElement): Page {
  setTitle('Summary');
  const controller = new AbortController();
  const charts: Chart[] = [];
  const after = h('input', { id: 'summary-after', type: 'date', value: localDate(6), required: true });
  const before = h('input', { id: 'summary-before', type: 'date', value: localDate(0), required: true });
  const bucket = h('select', { id: 'summary-bucket' }, h('option', { value: 'day' }, 'Day'), h('option', { value: 'hour' }, 'Hour'));
  const form = h(
    'form',
    { class: 'filters', 'aria-label': 'Summary span' },
    h('div', { class: 'field' }, h('label', { for: 'summary-after' }, 'From'), after),
    h('div', { class: 'field' }, h('label', { for: 'summary-before' }, 'To (inclusive)'), before),
    h('div', { class: 'field' }, h('label', { for: 'summary-bucket' }, 'Group by'), bucket),
    h('div', { class: 'field actions' }, h('button', { type: 'submit' }, 'Show')),
  );
  const message = h('p', { id: 'summary-status', class: 'status-line', role: 'status' });
  const body = h('div', { id: 'summary' });
  main.replaceChildren(h('h1', { tabindex: -1 }, 'Summary'), form, message, body);

  function draw(stats: Stats): void {
    for (const chart of charts.splice(0)) chart.destroy();
    const t = stats.totals;
    const byVariant = stats.by_variant as unknown as Row[];
    const byWorker = stats.by_worker as unknown as Row[];
    const variantColour = colours(byVariant.map((row) => String(row.variant)));
    const workerColour = colours(byWorker.map((row) => String(row.worker)));
    const workflows = series(stats, byVariant, 'variant', 'workflows');
    const variantCost = series(stats, byVariant, 'variant', 'cost_usd');
    const workerTokens = series(stats, byWorker, 'worker', 'tokens');
    const workerCost = series(stats, byWorker, 'worker', 'cost_usd');
    const reasons = stats.failure_reasons;
    const figures = h(
      'div',
      { id: 'summary-totals', class: 'figures' },
      facts([
        ['Workflows', int(t.workflows)],
        ['Completed', int(t.completed)],
        ['Failed', int(t.failed)],
        ['Cancelled', int(t.cancelled)],
        ['Running', int(t.running)],
        ['Queued', int(t.queued)],
        ['Tokens', int(t.tokens)],
        ['Cost', usd(t.cost_usd)],
        ['Valid plan rate', percent(t.valid_plan_rate)],
        ['Latency p50', ms(t.latency_ms_p50)],
        ['Latency p95', ms(t.latency_ms_p95)],
      ]),
    );
    const per = stats.bucket === 'hour' ? 'per hour' : 'per day (UTC days)';
    // Charts are made once their canvases are in the page, so they size to their boxes.
    const pending: (() => void)[] = [];
    body.replaceChildren(
      h('h2', {}, 'Totals'),
      figures,
      h('h2', {}, 'Over time'),
      h(
        'div',
        { class: 'charts' },
        chartFigure(charts, 'chart-workflows', `Workflows by variant, ${per}`, `${int(t.workflows)} workflows in ${workflows.names.length} variants`, stacked(workflows, variantColour, false), seriesTable(workflows, false), pending),
        chartFigure(charts, 'chart-variant-cost', `Cost by variant, ${per}`, `${usd(t.cost_usd)} in all`, stacked(variantCost, variantColour, true), seriesTable(variantCost, true), pending),
        chartFigure(charts, 'chart-worker-tokens', `Tokens by worker, ${per}`, `${workerTokens.names.length} workers`, stacked(workerTokens, workerColour, false), seriesTable(workerTokens, false), pending),
        chartFigure(charts, 'chart-worker-cost', `Cost by worker, ${per}`, `${workerCost.names.length} workers`, stacked(workerCost, workerColour, true), seriesTable(workerCost, true), pending),
      ),
      h('h2', {}, 'Failure reasons'),
      reasons.length
        ? chartFigure(
            charts,
            'chart-failures',
            'Failed workflows by reason',
            `${reasons.length} reasons, ${int(t.failed)} failures`,
            {
              type: 'bar',
              data: {
                labels: reasons.map((r) => (r.reason.length > 60 ? `${r.reason.slice(0, 59)}…` : r.reason)),
                datasets: [{ label: 'Failed workflows', data: reasons.map((r) => r.count), backgroundColor: FAILED, maxBarThickness: 32 }],
              },
              options: {
                indexAxis: 'y',
                responsive: true,
                maintainAspectRatio: false,
                scales: { x: { beginAtZero: true, ticks: { precision: 0 } } },
                plugins: { legend: { display: false } },
              },
            },
            { head: ['Reason', 'Failed workflows'], rows: reasons.map((r) => [r.reason, r.count]) },
            pending,
          )
        : h('p', { class: 'muted' }, 'No failures in this span.'),
    );
    for (const make of pending) make();
  }

  async function load(): Promise<void> {
    if (!after.value || !before.value) return;
    const params = new URLSearchParams({
      created_after: dayStart(after.value),
      created_before: dayStart(before.value, 1),
      bucket: bucket.value,
    });
    message.textContent = 'Loading…';
    try {
      draw(await api<Stats>('/v1/stats', { params, signal: controller.signal }));
      message.textContent = '';
    } catch (error) {
      if (!isAbort(error)) message.textContent = `Could not load the summary: ${error instanceof Error ? error.message : String(error)}`;
    }
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    void load();
  });
  for (const control of [after, before, bucket]) control.addEventListener('change', () => void load());
  void load();
  return {
    dispose() {
      controller.abort();
      for (const chart of charts.splice(0)) chart.destroy();
    },
  };
}
