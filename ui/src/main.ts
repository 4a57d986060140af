// The viewer's entry: checks whether the API wants a key, then routes on the URL's hash:
// #/ (workflows), #/workflows/<id> (one trace), #/summary (figures and charts).
import './style.css';
import { admits, forgetKey, onUnauthorized, storedKey } from './api';
import { h } from './dom';
import { listPage } from './pages/list';
import { loginPage } from './pages/login';
import { type Page, setTitle } from './pages/page';
import { summaryPage } from './pages/summary';
import { notFound, workflowPage } from './pages/workflow';

const main = document.getElementById('main') as HTMLElement;
const nav = document.getElementById('site-nav') as HTMLElement;
const signOut = document.getElementById('sign-out') as HTMLButtonElement;
const mode = document.getElementById('auth-mode') as HTMLElement;

let page: Page | null = null;
let admitted = false; // signed in, or the server is open (local mode without keys)

function leave(): void {
  page?.dispose();
  page = null;
}

function showLogin(notice: string | null): void {
  leave();
  admitted = false;
  nav.hidden = true;
  signOut.hidden = true;
  mode.textContent = '';
  loginPage(main, notice, () => {
    admitted = true;
    route(true);
  });
}

function route(moveFocus = true): void {
  leave();
  if (!admitted) return;
  nav.hidden = false;
  const key = storedKey();
  signOut.hidden = key === null;
  mode.textContent = key === null ? 'Open local mode (no key needed)' : 'Signed in with an API key';
  const hash = location.hash.replace(/^#/, '') || '/';
  const path = hash.split('?')[0] ?? '/';
  const workflow = /^\/workflows\/([^/]+)$/.exec(path);
  if (path === '/') page = listPage(main);
  else if (path === '/summary') page = summaryPage(main);
  else if (workflow) {
    const id = decodeURIComponent(workflow[1] ?? '');
    page = workflowPage(main, id, () => notFound(main, id));
  } else {
    setTitle('Page not found');
    main.replaceChildren(
      h('h1', { tabindex: -1 }, 'Page not found'),
      h('p', {}, h('a', { href: '#/' }, 'Back to the workflows')),
    );
  }
  for (const link of nav.querySelectorAll('a')) {
    const target = link.getAttribute('href')?.replace(/^#/, '');
    if ((target === '/' && (path === '/' || workflow)) || target === path) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  // A new view: move focus to its heading, so screen readers announce it.
  if (moveFocus) main.querySelector<HTMLElement>('h1')?.focus({ preventScroll: true });
}

async function start(): Promise<void> {
  if (storedKey() !== null) {
    admitted = true;
    route(false);
    return;
  }
  try {
    admitted = await admits(null);
  } catch (error) {
    setTitle('API unreachable');
    main.replaceChildren(h('h1', {}, 'The API did not answer'), h('p', {}, error instanceof Error ? error.message : String(error)));
    return;
  }
  if (admitted) route(false);
  else showLogin(null);
}

onUnauthorized(() => {
  if (!admitted) return;
  forgetKey();
  showLogin('The server refused the key (revoked, or keys are now required). Sign in again.');
});
signOut.addEventListener('click', () => {
  forgetKey();
  admitted = false;
  leave();
  void start();
});
window.addEventListener('hashchange', () => route(true));
void start();
