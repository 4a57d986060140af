// What every route renders into <main>, and undoes when the route changes.

export interface Page {
  /** Stops timers, streams and requests, destroys charts. */
  dispose(): void;
}

export function setTitle(title: string): void {
  document.title = `${title} · Conductor traces`;
}
