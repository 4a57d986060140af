// The JSON API, same origin (/v1/...). The key the user typed is kept in sessionStorage (this
// tab only, gone when it closes) and sent as a bearer token on every call.

const KEY_ITEM = 'conductor.apiKey';

export class Unauthorized extends Error {}
export class NotFound extends Error {}
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export function storedKey(): string | null {
  return sessionStorage.getItem(KEY_ITEM);
}

export function storeKey(key: string): void {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function forgetKey(): void {
  sessionStorage.removeItem(KEY_ITEM);
}

let unauthorizedHandler: (() => void) | null = null;

/** Called on any 401 after sign-in: the key was revoked, or keys now exist on an open server. */
export function onUnauthorized(handler: () => void): void {
  unauthorizedHandler = handler;
}

export function authHeaders(key: string | null = storedKey()): Record<string, string> {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** The API's own message from an OpenAI-style error body, else the status line. */
async function errorMessage(reply: Response): Promise<string> {
  try {
    const body: unknown = await reply.json();
    const message = (body as { error?: { message?: unknown } }).error?.message;
    if (typeof message === 'string') return message;
  } catch {
    // not JSON: fall through
  }
  return `${reply.status} ${reply.statusText}`.trim();
}

export interface CallOptions {
  method?: 'GET' | 'POST';
  body?: unknown;
  signal?: AbortSignal;
  params?: URLSearchParams;
}

/** GET or POST a JSON endpoint; 401 signs out, 404 throws NotFound, others ApiError. */
export async function api<T>(path: string, options: CallOptions = {}): Promise<T> {
  const query = options.params?.toString();
  const headers: Record<string, string> = { Accept: 'application/json', ...authHeaders() };
  const init: RequestInit = { method: options.method ?? 'GET', headers, cache: 'no-store' };
  if (options.signal) init.signal = options.signal;
  if (options.body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(options.body);
  }
  const reply = await fetch(query ? `${path}?${query}` : path, init);
  if (reply.status === 401) {
    unauthorizedHandler?.();
    throw new Unauthorized(await errorMessage(reply));
  }
  if (reply.status === 404) throw new NotFound(await errorMessage(reply));
  if (!reply.ok) throw new ApiError(reply.status, await errorMessage(reply));
  return (await reply.json()) as T;
}

/** Whether the server lets this caller in: with ``key``, or without one (open local mode). */
export async function admits(key: string | null): Promise<boolean> {
  const reply = await fetch('/v1/models', { headers: authHeaders(key), cache: 'no-store' });
  if (reply.status === 401) return false;
  if (!reply.ok) throw new ApiError(reply.status, await errorMessage(reply));
  return true;
}

export function isAbort(error: unknown): boolean {
  return error instanceof DOMException && error.name === 'AbortError';
}
