// A small Markdown renderer that builds DOM nodes directly: model output is only ever text in
// text nodes, never parsed as HTML, so nothing it says can run. It covers what chat answers
// use: paragraphs, headings, lists, quotes, fenced code (with a copy button), rules, tables,
// and inline code, bold, italic, strikethrough and http(s) links.

import { h } from "./dom.js";

const FENCE = /^(\s*)(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const TABLE_SEP = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

/** A DocumentFragment for `source`. */
export function renderMarkdown(source) {
  const fragment = document.createDocumentFragment();
  fragment.append(...blocks(String(source).replace(/\r\n?/g, "\n").split("\n")));
  return fragment;
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      const marker = fence[2];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trimStart().startsWith(marker)) body.push(lines[i++]);
      i++; // the closing fence (or the end of an answer still streaming)
      out.push(codeBlock(body.join("\n"), fence[3]));
      continue;
    }
    if (!line.trim()) {
      i++;
      continue;
    }
    const heading = line.match(HEADING);
    if (heading) {
      out.push(h(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
      i++;
      continue;
    }
    if (RULE.test(line)) {
      out.push(h("hr"));
      i++;
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])) {
      const rows = [line];
      i += 2;
      while (i < lines.length && lines[i].includes("|") && lines[i].trim()) rows.push(lines[i++]);
      out.push(table(rows));
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(lines[i++].match(QUOTE)[1]);
      out.push(h("blockquote", {}, blocks(body)));
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      const numbered = NUMBERED.test(line);
      const pattern = numbered ? NUMBERED : BULLET;
      const items = [];
      while (i < lines.length && pattern.test(lines[i])) {
        const match = lines[i].match(pattern);
        items.push(h("li", {}, inline(numbered ? match[2] : match[1])));
        i++;
        // Indented continuation lines belong to the item.
        while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !pattern.test(lines[i])) {
          items[items.length - 1].append(" ", ...inline(lines[i++].trim()));
        }
      }
      const start = numbered ? Number(line.match(NUMBERED)[1]) : null;
      out.push(h(numbered ? "ol" : "ul", start && start !== 1 ? { start } : {}, items));
      continue;
    }
    const paragraph = [];
    while (
      i < lines.length &&
      lines[i].trim() &&
      !FENCE.test(lines[i]) &&
      !HEADING.test(lines[i]) &&
      !BULLET.test(lines[i]) &&
      !NUMBERED.test(lines[i]) &&
      !QUOTE.test(lines[i])
    ) {
      paragraph.push(lines[i++]);
    }
    const parts = [];
    paragraph.forEach((text, n) => {
      if (n) parts.push(h("br"));
      parts.push(...inline(text));
    });
    out.push(h("p", {}, parts));
  }
  return out;
}

function codeBlock(code, language) {
  const copy = h("button.copy", { type: "button", "aria-label": "Copy code" }, "Copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(code);
      copy.textContent = "Copied";
    } catch {
      copy.textContent = "Copy failed";
    }
    setTimeout(() => (copy.textContent = "Copy"), 1500);
  });
  return h(
    "div.code",
    {},
    h("div.code-head", {}, h("span", {}, language || "code"), copy),
    h("pre", {}, h("code", language ? { "data-language": language } : {}, code)),
  );
}

function table(rows) {
  const cells = (row) =>
    row
      .trim()
      .replace(/^\|/, "")
      .replace(/\|$/, "")
      .split("|")
      .map((c) => c.trim());
  const [head, ...body] = rows;
  return h(
    "div.table-wrap",
    {},
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, cells(head).map((c) => h("th", {}, inline(c))))),
      h("tbody", {}, body.map((row) => h("tr", {}, cells(row).map((c) => h("td", {}, inline(c)))))),
    ),
  );
}

// Inline spans, earliest match first: `code`, **bold**, *italic* / _italic_, ~~strike~~, [text](url).
const INLINE = [
  { re: /`([^`]+)`/, make: (m) => h("code", {}, m[1]) },
  { re: /\*\*([^*]+)\*\*|__([^_]+)__/, make: (m) => h("strong", {}, inline(m[1] ?? m[2])) },
  { re: /~~([^~]+)~~/, make: (m) => h("del", {}, inline(m[1])) },
  { re: /\*([^*\s][^*]*)\*|(?<![\w])_([^_\s][^_]*)_(?![\w])/, make: (m) => h("em", {}, inline(m[1] ?? m[2])) },
  { re: /\[([^\]]+)\]\(([^)\s]+)\)/, make: (m) => link(m[1], m[2]) },
  { re: /\bhttps?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/, make: (m) => link(m[0], m[0]) },
];

/** Inline nodes for one line of text. */
export function inline(text) {
  const out = [];
  let rest = text;
  while (rest) {
    let best = null;
    for (const rule of INLINE) {
      const match = rest.match(rule.re);
      if (match && (best === null || match.index < best.match.index)) best = { rule, match };
    }
    if (!best) {
      out.push(rest);
      break;
    }
    if (best.match.index) out.push(rest.slice(0, best.match.index));
    out.push(best.rule.make(best.match));
    rest = rest.slice(best.match.index + best.match[0].length);
  }
  return out;
}

/** Only http(s) links become anchors; anything else (javascript:, data:) stays text. */
function link(label, href) {
  let url = null;
  try {
    url = new URL(href);
  } catch {
    url = null;
  }
  if (!url || (url.protocol !== "http:" && url.protocol !== "https:")) return `[${label}](${href})`;
  return h("a", { href: url.href, target: "_blank", rel: "noopener noreferrer nofollow" }, label);
}
