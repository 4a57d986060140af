// How numbers and times are shown.
import type { Usage } from './types';

export function tokens(usage: Usage): number {
  return usage.total_tokens ?? usage.prompt_tokens + usage.completion_tokens;
}

export function int(value: number): string {
  return value.toLocaleString('en-US');
}

/** USD with enough digits to tell tiny per-call costs apart. */
export function usd(value: number): string {
  if (value === 0) return '$0';
  if (Math.abs(value) >= 1) return `$${value.toFixed(2)}`;
  return `$${value.toPrecision(3).replace(/0+$/, '').replace(/\.$/, '')}`;
}

export function ms(value: number | null | undefined): string {
  if (value === null || value === undefined) return '–';
  if (value < 1000) return `${Math.round(value)} ms`;
  if (value < 60_000) return `${(value / 1000).toFixed(value < 10_000 ? 2 : 1)} s`;
  return `${Math.floor(value / 60_000)} min ${Math.round((value % 60_000) / 1000)} s`;
}

export function time(iso: string | null | undefined): string {
  if (!iso) return '–';
  const at = new Date(iso);
  return Number.isNaN(at.getTime()) ? iso : at.toLocaleString();
}

export function percent(share: number | null): string {
  return share === null ? '–' : `${(share * 100).toFixed(1)}%`;
}

/** The first line of ``text``, cut to ``max`` characters. */
export function firstLine(text: string, max = 120): string {
  const line = text.split(/\r?\n/, 1)[0] ?? '';
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

export function usageText(usage: Usage): string {
  return `${int(tokens(usage))} (${int(usage.prompt_tokens)} prompt, ${int(usage.completion_tokens)} completion)`;
}

/** A local calendar date (yyyy-mm-dd) as the start of that day, as an ISO instant. */
export function dayStart(date: string, plusDays = 0): string {
  const [y, m, d] = date.split('-').map(Number);
  return new Date(y ?? 1970, (m ?? 1) - 1, (d ?? 1) + plusDays).toISOString();
}

/** Today, or ``days`` before it, as yyyy-mm-dd in local time (the value of <input type=date>). */
export function localDate(days = 0): string {
  const at = new Date();
  at.setDate(at.getDate() - days);
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}`;
}
