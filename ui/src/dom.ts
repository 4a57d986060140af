// Small DOM builders. Text always goes in as text nodes: model output, questions and errors
// are untrusted and never parsed as HTML (there is no innerHTML anywhere in the viewer).

type Attr = string | number | boolean | null | undefined;
export type Child = Node | string | number | null | undefined | false;

function setAttrs(el: Element, attrs: Record<string, Attr>): void {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    el.setAttribute(name, value === true ? '' : String(value));
  }
}

function append(el: Element, children: (Child | Child[])[]): void {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(typeof child === 'number' ? String(child) : child);
  }
}

/** An HTML element with attributes and children (strings become text nodes). */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, Attr> = {},
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An SVG element; colours go in presentation attributes (fill, stroke), never style="". */
export function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, Attr> = {},
  ...children: (Child | Child[])[]
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG_NS, tag) as SVGElementTagNameMap[K];
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

/** A definition list row pair for key/value panels. */
export function facts(rows: [string, Child | Child[]][]): HTMLDListElement {
  return h(
    'dl',
    { class: 'facts' },
    rows.map(([term, value]) => h('div', {}, h('dt', {}, term), h('dd', {}, value))),
  );
}

/** A <pre> that scrolls: focusable, so keyboard users can scroll it too (no aria-label: a
 * <pre> is a generic element, which may not be named). */
export function pre(text: string): HTMLPreElement {
  return h('pre', { class: 'text', tabindex: 0 }, text);
}
