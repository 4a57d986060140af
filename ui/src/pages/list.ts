// #/ : the tenant's workflows, newest first, with filters; the first page is fetched again every
// 2 s while the tab is visible, merged by id, so new and running workflows update in place.
import { api, isAbort } from '../api';
import { h } from '../dom';
import { dayStart, firstLine, int, ms, time, tokens, usd } from '../format';
import type { ModelCard, WorkflowList, WorkflowSummary } from '../types';
import { type Page, setTitle } from './page';

const PAGE_SIZE = 50; // the API allows up to 100 (reads.MAX_PAGE_SIZE)
const REFRESH_MS = 2000;
const TYPING_MS = 350;
const STATUSES = ['queued', 'running', 'completed', 'failed', 'cancelled'] as const;

/** Newest first, as the API orders pages: created_at, then id, both descending. */
function newer(a: WorkflowSummary, b: WorkflowSummary): boolean {
  const ta = Date.parse(a.created_at);
  const tb = Date.parse(b.created_at);
  if (ta !== tb) return ta > tb;
  if (a.created_at !== b.created_at) return a.created_at > b.created_at;
  return a.id > b.id;
}

function field(label: string, control: HTMLElement, hint?: HTMLElement): HTMLElement {
  return h('div', { class: 'field' }, h('label', { for: control.id }, label), control, hint ?? null);
}

export function listPage(main: HTMLElement): Page {
  setTitle('Workflows');
  const controller = new AbortController();
  let items: WorkflowSummary[] = [];
  let tailHasMore = false; // whether more follow the last page loaded
  let generation = 0; // bumped when the filters change: older answers are dropped
  let refreshing = false;
  const rows = new Map<string, { row: HTMLTableRowElement; key: string }>();

  const status = h('select', { id: 'filter-status', name: 'status' }, h('option', { value: '' }, 'Any'), STATUSES.map((st) => h('option', { value: st }, st)));
  const variant = h('input', { id: 'filter-variant', name: 'variant', type: 'text', list: 'variant-options', autocomplete: 'off', spellcheck: 'false' });
  const variants = h('datalist', { id: 'variant-options' });
  const labelHint = h('span', { id: 'filter-label-hint', class: 'hint' }, 'NAME:VALUE');
  const label = h('input', { id: 'filter-label', name: 'label', type: 'text', placeholder: 'team:search', autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'filter-label-hint' });
  const after = h('input', { id: 'filter-after', name: 'created_after', type: 'date' });
  const before = h('input', { id: 'filter-before', name: 'created_before', type: 'date' });
  const q = h('input', { id: 'filter-q', name: 'q', type: 'search', autocomplete: 'off' });
  const clear = h('button', { type: 'button', class: 'secondary' }, 'Clear');
  const form = h(
    'form',
    { class: 'filters', role: 'search', 'aria-label': 'Filter workflows' },
    field('Search questions', q),
    field('Status', status),
    field('Variant', variant),
    variants,
    field('Label', label, labelHint),
    field('Created from', after),
    field('Created to (inclusive)', before),
    h('div', { class: 'field actions' }, h('button', { type: 'submit' }, 'Apply'), clear),
  );
  const tbody = h('tbody');
  const table = h(
    'table',
    { id: 'workflow-table', class: 'data' },
    h('caption', { class: 'visually-hidden' }, 'Workflows, newest first'),
    h('thead', {}, h('tr', {}, ['Status', 'Variant', 'Question', 'Steps', 'Tokens', 'Cost', 'Latency', 'Created'].map((name) => h('th', { scope: 'col' }, name)))),
    tbody,
  );
  const empty = h('p', { id: 'list-empty', class: 'muted', hidden: true }, 'No workflows match these filters.');
  const message = h('p', { id: 'list-status', class: 'status-line', role: 'status' });
  const loadMore = h('button', { id: 'load-more', type: 'button', hidden: true }, 'Load more');
  main.replaceChildren(
    h('h1', { tabindex: -1 }, 'Workflows'),
    form,
    message,
    h('div', { class: 'table-scroll' }, table),
    empty,
    loadMore,
  );

  function params(): URLSearchParams | null {
    const found = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (status.value) found.set('status', status.value);
    if (variant.value.trim()) found.set('variant', variant.value.trim());
    const labelText = label.value.trim();
    label.removeAttribute('aria-invalid');
    if (labelText) {
      const colon = labelText.indexOf(':');
      if (colon < 1) {
        label.setAttribute('aria-invalid', 'true');
        message.textContent = 'Label: write NAME:VALUE (for example team:search).';
        return null;
      }
      found.set('label', labelText);
    }
    if (after.value) found.set('created_after', dayStart(after.value));
    if (before.value) found.set('created_before', dayStart(before.value, 1));
    if (q.value.trim()) found.set('q', q.value.trim());
    return found;
  }

  function renderRow(row: HTMLTableRowElement, item: WorkflowSummary): void {
    const question = firstLine(item.question, 100) || '(empty question)';
    const ended = item.finished_at !== null;
    row.replaceChildren(
      h('td', {}, h('span', { class: `badge status-${item.status}` }, item.status)),
      h('td', {}, item.variant),
      h(
        'td',
        { class: 'question' },
        h('a', { href: `#/workflows/${item.id}` }, question),
        item.error ? h('div', { class: 'row-error' }, firstLine(item.error, 100)) : null,
      ),
      h('td', { class: 'num' }, int(item.step_count)),
      h('td', { class: 'num' }, int(tokens(item.usage))),
      h('td', { class: 'num' }, usd(item.cost_usd)),
      h('td', { class: 'num' }, ended ? ms(item.latency_ms) : '–'),
      h('td', {}, h('time', { datetime: item.created_at }, time(item.created_at))),
    );
  }

  function render(): void {
    const wanted = new Set(items.map((item) => item.id));
    for (const [id, entry] of rows) {
      if (!wanted.has(id)) {
        entry.row.remove();
        rows.delete(id);
      }
    }
    // Rows are moved and updated in place, never rebuilt: the browser's scroll anchoring then
    // keeps what the reader looks at still while new workflows arrive above it.
    let cursor = tbody.firstElementChild;
    for (const item of items) {
      const key = JSON.stringify(item);
      let entry = rows.get(item.id);
      if (!entry) {
        const row = h('tr', { 'data-workflow-id': item.id, class: 'clickable' });
        row.addEventListener('click', (event) => {
          const target = event.target as Element;
          if (target.closest('a') || window.getSelection()?.toString()) return;
          location.hash = `#/workflows/${item.id}`;
        });
        entry = { row, key: '' };
        rows.set(item.id, entry);
      }
      if (entry.key !== key) {
        entry.row.setAttribute('data-status', item.status);
        renderRow(entry.row, item);
        entry.key = key;
      }
      if (entry.row === cursor) cursor = cursor.nextElementSibling;
      else tbody.insertBefore(entry.row, cursor);
    }
    empty.hidden = items.length > 0;
    loadMore.hidden = !tailHasMore;
    const shown = `${items.length} workflow${items.length === 1 ? '' : 's'} shown`;
    if (message.textContent !== shown) message.textContent = shown;
  }

  function fail(error: unknown): void {
    if (isAbort(error)) return;
    message.textContent = `Could not load workflows: ${error instanceof Error ? error.message : String(error)}`;
  }

  /** The filters changed: start over from the first page. */
  async function reload(): Promise<void> {
    const query = params();
    if (!query) return;
    const mine = ++generation;
    try {
      const page = await api<WorkflowList>('/v1/workflows', { params: query, signal: controller.signal });
      if (mine !== generation) return;
      items = page.data;
      tailHasMore = page.has_more;
      render();
    } catch (error) {
      fail(error);
    }
  }

  /** The first page again, merged into what is shown (live updates). */
  async function refresh(): Promise<void> {
    const query = params();
    if (!query || refreshing) return;
    refreshing = true;
    const mine = generation;
    try {
      const page = await api<WorkflowList>('/v1/workflows', { params: query, signal: controller.signal });
      if (mine !== generation) return;
      const fresh = new Set(page.data.map((item) => item.id));
      const oldest = page.data[page.data.length - 1];
      // Past the fresh page: what "Load more" brought. Within it: only what the page still has
      // (a workflow that no longer matches, e.g. a running one that ended, leaves the list).
      const older = page.has_more && oldest ? items.filter((item) => !fresh.has(item.id) && newer(oldest, item)) : [];
      if (!older.length) tailHasMore = page.has_more;
      items = [...page.data, ...older];
      render();
    } catch (error) {
      fail(error);
    } finally {
      refreshing = false;
    }
  }

  async function more(): Promise<void> {
    const query = params();
    const last = items[items.length - 1];
    if (!query || !last) return;
    query.set('after', last.id);
    const mine = generation;
    loadMore.disabled = true;
    try {
      const page = await api<WorkflowList>('/v1/workflows', { params: query, signal: controller.signal });
      if (mine !== generation) return;
      const known = new Set(items.map((item) => item.id));
      items = [...items, ...page.data.filter((item) => !known.has(item.id))];
      tailHasMore = page.has_more;
      render();
    } catch (error) {
      fail(error);
    } finally {
      loadMore.disabled = false;
    }
  }

  let typing: number | undefined;
  const later = () => {
    window.clearTimeout(typing);
    typing = window.setTimeout(() => void reload(), TYPING_MS);
  };
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    window.clearTimeout(typing);
    void reload();
  });
  for (const control of [status, after, before]) control.addEventListener('change', () => void reload());
  for (const control of [variant, label, q]) control.addEventListener('input', later);
  clear.addEventListener('click', () => {
    form.reset();
    void reload();
  });
  loadMore.addEventListener('click', () => void more());

  const timer = window.setInterval(() => {
    if (document.visibilityState === 'visible') void refresh();
  }, REFRESH_MS);
  const onVisible = () => {
    if (document.visibilityState === 'visible') void refresh();
  };
  document.addEventListener('visibilitychange', onVisible);

  void reload();
  // Variant names for the variant filter's suggestions; the list works without them.
  api<{ data: ModelCard[] }>('/v1/models', { signal: controller.signal })
    .then((models) => {
      variants.replaceChildren(...models.data.filter((m) => m.kind === 'variant').map((m) => h('option', { value: m.id })));
    })
    .catch(() => undefined);

  return {
    dispose() {
      controller.abort();
      window.clearInterval(timer);
      window.clearTimeout(typing);
      document.removeEventListener('visibilitychange', onVisible);
    },
  };
}
