// #/workflows/<id> : one workflow's trace: header, plan graph, timeline, the selected step,
// every Conductor call, and feedback. While it runs, its event stream is followed and the
// workflow re-read (debounced) on each event, until the outcome.
import { ApiError, api, authHeaders, isAbort, NotFound } from '../api';
import { facts, h, pre } from '../dom';
import { int, ms, time, tokens, usageText, usd } from '../format';
import { legend, planGraph } from '../graph';
import { colours } from '../palette';
import { readEvents } from '../sse';
import { timeline } from '../timeline';
import { TERMINAL, type Step, type Workflow } from '../types';
import { type Page, setTitle } from './page';

const REREAD_MS = 200; // events come in bursts (a plan, then steps starting together)
const RETRY_MS = 2000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function notFound(main: HTMLElement, id: string): void {
  setTitle('Workflow not found');
  main.replaceChildren(
    h(
      'section',
      { id: 'not-found' },
      h('h1', { tabindex: -1 }, 'Workflow not found'),
      h('p', {}, 'No workflow ', h('code', {}, id), ' is visible with this key: it does not exist, or belongs to another tenant.'),
      h('p', {}, h('a', { href: '#/' }, 'Back to the workflows')),
    ),
  );
}

function text(value: string | null, empty: string): HTMLElement {
  return value ? pre(value) : h('span', { class: 'muted' }, empty);
}

function badge(status: string): HTMLElement {
  return h('span', { class: `badge status-${status}` }, status);
}

function header(wf: Workflow): HTMLElement {
  const labels = Object.entries(wf.metadata);
  return facts([
    ['Status', badge(wf.status)],
    ['Variant', wf.variant],
    ['Question', pre(wf.question)],
    ['Answer', text(wf.answer, TERMINAL.has(wf.status) ? 'No answer' : 'Not yet')],
    ...(wf.error ? ([['Error', h('div', { class: 'error-text' }, pre(wf.error))]] as [string, HTMLElement][]) : []),
    ['Tokens', usageText(wf.usage)],
    ['Cost', usd(wf.cost_usd)],
    ['Latency', wf.finished_at ? ms(wf.latency_ms) : '–'],
    ['Plan valid', wf.planner_calls.length ? (wf.plan_valid ? 'yes' : 'no') : '–'],
    ['Created', h('time', { datetime: wf.created_at }, time(wf.created_at))],
    ['Finished', wf.finished_at ? h('time', { datetime: wf.finished_at }, time(wf.finished_at)) : '–'],
    ...(labels.length
      ? ([['Labels', h('ul', { class: 'chips' }, labels.map(([k, v]) => h('li', {}, `${k}: ${v}`)))]] as [string, HTMLElement][])
      : []),
  ]);
}

function attemptsTable(step: Step): HTMLElement {
  if (!step.attempts.length) return h('p', { class: 'muted' }, 'No provider call yet.');
  const cols = ['#', 'Worker', 'Status', 'Error class', 'HTTP status', 'Latency', 'Quota wait', 'Tokens', 'Error'];
  return h(
    'div',
    { class: 'table-scroll' },
    h(
      'table',
      { class: 'data attempts' },
      h('caption', { class: 'visually-hidden' }, `Attempts of step ${step.index}`),
      h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c)))),
      h(
        'tbody',
        {},
        step.attempts.map((a) =>
          h(
            'tr',
            { 'data-attempt': a.number, 'data-status': a.status },
            h('td', { class: 'num' }, a.number),
            h('td', {}, a.worker ?? step.worker),
            h('td', {}, a.status === 'ok' ? 'ok' : h('span', { class: 'error-text' }, '✗ error')),
            h('td', {}, a.error_class ?? '–'),
            h('td', { class: 'num' }, a.status_code ?? '–'),
            h('td', { class: 'num' }, ms(a.latency_ms)),
            h('td', { class: 'num' }, ms(a.quota_wait_ms)),
            h('td', { class: 'num' }, int(tokens(a.usage))),
            h('td', { class: 'wrap' }, a.error ?? ''),
          ),
        ),
      ),
    ),
  );
}

function stepDetail(wf: Workflow, index: number | null): HTMLElement[] {
  const step = wf.steps.find((st) => st.index === index);
  if (!step) return [h('p', { class: 'muted' }, 'Select a step in the graph to see what it was asked, what it saw and what it answered.')];
  const byIndex = new Map(wf.steps.map((st) => [st.index, st]));
  const access = step.access_list.map((entry) => String(entry)).join(', ') || 'none';
  return [
    h('h3', {}, `Step ${step.index} · ${step.kind === 'conductor' ? 'Conductor step' : 'worker'} ${step.worker}`),
    facts([
      ['Status', badge(step.status)],
      ['Round', step.round],
      ['Access list', access],
      ['Tokens', usageText(step.usage)],
      ['Cost', usd(step.cost_usd)],
      ['Latency', ms(step.latency_ms)],
      ['Started', time(step.started_at)],
      ['Finished', time(step.finished_at)],
    ]),
    h('h4', {}, 'Subtask'),
    pre(step.subtask),
    h('h4', {}, 'Context it saw'),
    step.visible_steps.length
      ? h(
          'ul',
          { class: 'visible-steps' },
          step.visible_steps.map((j) => {
            const seen = byIndex.get(j);
            return h(
              'li',
              { 'data-step': j },
              h(
                'details',
                {},
                h('summary', {}, `Step ${j}${seen ? ` · ${seen.worker} · ${seen.status}` : ''}`),
                seen?.output ? pre(seen.output) : h('p', { class: 'muted' }, 'No output.'),
              ),
            );
          }),
        )
      : h('p', { class: 'muted' }, 'No earlier step: only the question.'),
    h('h4', {}, 'Output'),
    text(step.output, step.status === 'pending' || step.status === 'running' ? 'Not yet' : 'None'),
    step.error ? h('div', { class: 'error-text' }, h('h4', {}, 'Error'), pre(step.error)) : null,
    h('h4', {}, 'Attempts'),
    attemptsTable(step),
  ].filter((el): el is HTMLElement => el !== null);
}

function plannerCalls(wf: Workflow): HTMLElement[] {
  if (!wf.planner_calls.length) return [h('p', { class: 'muted' }, 'The Conductor has not answered yet.')];
  return wf.planner_calls.map((call, n) =>
    h(
      'article',
      { class: 'planner-call', 'data-round': call.round, 'data-valid': String(call.valid) },
      h('h3', {}, `Call ${n + 1} · round ${call.round}`),
      facts([
        ['Valid', call.valid ? 'yes' : h('span', { class: 'error-text' }, 'no')],
        ['Errors', call.errors.length ? h('ul', {}, call.errors.map((e) => h('li', {}, e))) : 'none'],
        ['Backend', call.backend || '–'],
        ['Tokens', usageText(call.usage)],
        ['Cost', usd(call.cost_usd)],
        ['Latency', ms(call.latency_ms)],
      ]),
      h('h4', {}, 'Raw output'),
      pre(call.raw_output),
    ),
  );
}

export function workflowPage(main: HTMLElement, id: string, onNotFound: () => void): Page {
  const controller = new AbortController();
  if (!UUID.test(id)) {
    notFound(main, id);
    return { dispose: () => controller.abort() };
  }
  setTitle(`Workflow ${id.slice(0, 8)}`);
  let wf: Workflow | null = null;
  let selected: number | null = null;
  let reread: number | undefined;

  const live = h('p', { id: 'live-status', class: 'status-line', role: 'status' });
  const headerBox = h('div', { id: 'workflow-header' });
  const graphBox = h('div', { id: 'plan-graph', class: 'scroll', tabindex: 0, role: 'region', 'aria-label': 'Plan graph' });
  const legendBox = h('div');
  const timelineBox = h('div', { id: 'timeline' });
  const detailBox = h('div', { id: 'step-detail' });
  const callsBox = h('div', { id: 'planner-calls' });
  const stored = h('p', { id: 'feedback-stored' });
  const score = h('input', { id: 'feedback-score', name: 'score', type: 'number', min: 0, max: 1, step: 0.01, required: true, inputmode: 'decimal' });
  const feedbackMessage = h('p', { id: 'feedback-message', class: 'status-line', role: 'status' });
  const feedbackForm = h(
    'form',
    { id: 'feedback-form', class: 'inline-form' },
    h('label', { for: 'feedback-score' }, 'Score from 0 (wrong) to 1 (right)'),
    score,
    h('button', { type: 'submit' }, 'Save score'),
  );
  main.replaceChildren(
    h('h1', { tabindex: -1 }, 'Workflow ', h('code', { class: 'id' }, id)),
    live,
    h('section', { 'aria-labelledby': 'h-summary' }, h('h2', { id: 'h-summary', class: 'visually-hidden' }, 'Summary'), headerBox),
    h('section', { 'aria-labelledby': 'h-plan' }, h('h2', { id: 'h-plan' }, 'Plan'), graphBox, legendBox),
    h('section', { 'aria-labelledby': 'h-timeline' }, h('h2', { id: 'h-timeline' }, 'Timeline'), timelineBox),
    h('section', { 'aria-labelledby': 'h-step' }, h('h2', { id: 'h-step' }, 'Step details'), detailBox),
    h('section', { 'aria-labelledby': 'h-calls' }, h('h2', { id: 'h-calls' }, 'Conductor calls'), callsBox),
    h('section', { 'aria-labelledby': 'h-feedback' }, h('h2', { id: 'h-feedback' }, 'Feedback'), stored, feedbackForm, feedbackMessage),
  );

  function select(index: number): void {
    selected = index;
    render();
    detailBox.scrollIntoView({ block: 'nearest' });
  }

  function render(): void {
    if (!wf) return;
    // Redrawing replaces the graph's nodes: keep keyboard focus on the same step.
    const focused = document.activeElement?.closest('.step-node')?.getAttribute('data-step');
    const colourOf = colours(wf.steps.filter((st) => st.kind === 'worker').map((st) => st.worker));
    headerBox.replaceChildren(header(wf));
    graphBox.replaceChildren(
      wf.steps.length ? planGraph(wf.steps, colourOf, selected, select) : h('p', { class: 'muted' }, 'No plan yet.'),
    );
    legendBox.replaceChildren(wf.steps.length ? legend(colourOf, wf.steps.some((st) => st.kind === 'conductor')) : '');
    timelineBox.replaceChildren(timeline(wf.steps, colourOf, select));
    detailBox.replaceChildren(...stepDetail(wf, selected));
    callsBox.replaceChildren(...plannerCalls(wf));
    stored.textContent = wf.feedback === null ? 'No score stored yet.' : `Stored score: ${wf.feedback}`;
    live.textContent = TERMINAL.has(wf.status) ? '' : `Live: this workflow is ${wf.status}; the page follows it.`;
    if (focused !== null && focused !== undefined) {
      graphBox.querySelector<SVGGElement>(`.step-node[data-step="${focused}"]`)?.focus();
    }
  }

  async function load(): Promise<void> {
    try {
      wf = await api<Workflow>(`/v1/workflows/${id}`, { signal: controller.signal });
      render();
    } catch (error) {
      if (isAbort(error)) return;
      if (error instanceof NotFound || (error instanceof ApiError && error.status === 400)) {
        controller.abort();
        onNotFound();
        return;
      }
      live.textContent = `Could not load the workflow: ${error instanceof Error ? error.message : String(error)}`;
    }
  }

  function soon(): void {
    if (reread !== undefined) return; // one read answers every event of a burst
    reread = window.setTimeout(() => {
      reread = undefined;
      void load();
    }, REREAD_MS);
  }

  async function follow(): Promise<void> {
    let last = 0;
    while (!controller.signal.aborted && wf && !TERMINAL.has(wf.status)) {
      try {
        await readEvents(`/v1/workflows/${id}/events?after=${last}`, authHeaders(), controller.signal, (event) => {
          if (event.id && /^\d+$/.test(event.id)) last = Number(event.id);
          soon();
        });
      } catch (error) {
        if (isAbort(error)) return;
        await new Promise((resolve) => window.setTimeout(resolve, RETRY_MS));
      }
      // The stream ends after the outcome (or broke): read the workflow to know which.
      window.clearTimeout(reread);
      reread = undefined;
      await load();
    }
  }

  feedbackForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const value = Number(score.value);
    if (score.value === '' || !Number.isFinite(value) || value < 0 || value > 1) {
      feedbackMessage.textContent = 'Enter a score from 0 to 1.';
      return;
    }
    feedbackMessage.textContent = 'Saving…';
    api<{ score: number }>(`/v1/workflows/${id}/feedback`, { method: 'POST', body: { score: value }, signal: controller.signal })
      .then((saved) => {
        if (wf) wf.feedback = saved.score;
        stored.textContent = `Stored score: ${saved.score}`;
        feedbackMessage.textContent = 'Score saved.';
      })
      .catch((error: unknown) => {
        if (!isAbort(error)) feedbackMessage.textContent = `Could not save the score: ${error instanceof Error ? error.message : String(error)}`;
      });
  });

  void load().then(() => follow());
  return {
    dispose() {
      controller.abort();
      window.clearTimeout(reread);
    },
  };
}
