// The sign-in form, shown when the server wants a key (it answered 401 without one).
import { admits, storeKey } from '../api';
import { h } from '../dom';
import { setTitle } from './page';

export function loginPage(main: HTMLElement, notice: string | null, signedIn: () => void): void {
  setTitle('Sign in');
  const key = h('input', { id: 'api-key', name: 'api-key', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true });
  const message = h('p', { id: 'login-message', class: 'error-text', role: 'alert' }, notice ?? '');
  const button = h('button', { type: 'submit' }, 'Sign in');
  const form = h(
    'form',
    { id: 'login-form', class: 'login' },
    h('div', { class: 'field' }, h('label', { for: 'api-key' }, 'API key'), key),
    button,
  );
  main.replaceChildren(
    h('h1', { tabindex: -1 }, 'Sign in'),
    h('p', {}, 'This server needs an API key (an operator makes one with ', h('code', {}, 'conductor keys create --tenant NAME'), '). It is kept in this tab only, until you sign out or close it.'),
    message,
    form,
  );
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const typed = key.value.trim();
    if (!typed) return;
    button.disabled = true;
    message.textContent = '';
    admits(typed)
      .then((ok) => {
        if (!ok) {
          message.textContent = 'That key was refused: unknown, revoked or mistyped.';
          key.select();
          return;
        }
        storeKey(typed);
        signedIn();
      })
      .catch((error: unknown) => {
        message.textContent = `Could not reach the API: ${error instanceof Error ? error.message : String(error)}`;
      })
      .finally(() => {
        button.disabled = false;
      });
  });
  key.focus();
}
