// molt's web view: reads the daemon's API under /api/, listens to
// /events, draws each sandbox's checkpoint tree in SVG. Data from the
// API is only ever set as text, never parsed as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const ROW = 22, INDENT = 18, X0 = 14;
const KINDS = ["full", "fs"];

const ui = { sandboxes: [], selected: null, detail: null, node: null, collapsed: new Set() };

// The token: from the URL's fragment (/#token=...), which no request
// carries, kept in this tab's session storage and sent in a header on
// every call. No cookie: a browser sends 127.0.0.1's cookies to every
// port of the host.
const TOKEN_HEADER = "X-Molt-UI-Token";
const token = (() => {
  const m = location.hash.match(/token=([0-9a-f]+)/);
  if (m) {
    sessionStorage.setItem("molt-ui-token", m[1]);
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem("molt-ui-token") || "";
})();

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") e.addEventListener("click", v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids) if (k != null) e.append(k instanceof Node ? k : String(k));
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}

async function api(method, path, body) {
  const opt = { method, headers: { [TOKEN_HEADER]: token }, credentials: "omit" };
  if (body !== undefined) {
    opt.headers["Content-Type"] = "application/json";
    opt.body = JSON.stringify(body);
  }
  const r = await fetch("/api" + path, opt);
  const text = await r.text();
  let v = null;
  try { v = text ? JSON.parse(text) : null; } catch (e) { v = { message: text }; }
  if (!r.ok) throw new Error((v && v.message) || r.status + " " + r.statusText);
  return v;
}

function bytes(n) {
  if (!n) return "0 B";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}
const ms = (v) => (v == null ? "" : v < 1000 ? v.toFixed(1) + " ms" : (v / 1000).toFixed(2) + " s");
const short = (id) => (id || "").slice(0, 12);
const sbName = (sb) => sb.name || short(sb.id);

function toast(msg, err) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.className = "toast" + (err ? " err" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.add("hidden"), err ? 8000 : 4000);
}

// confirmAction shows the in-page confirmation; fn runs on Confirm.
function confirmAction(title, text, fn) {
  const m = document.getElementById("modal");
  document.getElementById("modal-title").textContent = title;
  document.getElementById("modal-text").textContent = text;
  m.classList.remove("hidden");
  const ok = document.getElementById("modal-ok"), cancel = document.getElementById("modal-cancel");
  const close = () => { m.classList.add("hidden"); ok.onclick = cancel.onclick = null; };
  cancel.onclick = close;
  ok.onclick = async () => {
    close();
    try {
      const res = await fn();
      toast(title + ": done" + (res ? " — " + res : ""));
    } catch (e) {
      toast(title + ": " + e.message, true);
    }
    await refresh(true);
  };
  ok.focus();
}

async function loadList() {
  ui.sandboxes = (await api("GET", "/v1/sandboxes")) || [];
  ui.sandboxes.sort((a, b) => sbName(a).localeCompare(sbName(b)));
  if (ui.selected && !ui.sandboxes.some((s) => s.id === ui.selected)) {
    ui.selected = null; ui.detail = null; ui.node = null;
  }
  if (!ui.selected && ui.sandboxes.length) ui.selected = ui.sandboxes[0].id;
  drawList();
}

// drawn keeps what each part was last drawn from: a part is redrawn only
// when that changed (a redraw under the pointer would lose a click).
const drawn = { list: "", detail: "" };

function drawList() {
  const sig = JSON.stringify([ui.selected, ui.sandboxes.map((s) => [s.id, s.name, s.state, s.image])]);
  if (sig === drawn.list) return;
  drawn.list = sig;
  const nav = document.getElementById("sandboxes");
  nav.replaceChildren();
  if (!ui.sandboxes.length) nav.append(el("p", { class: "muted pad" }, "No sandboxes."));
  for (const sb of ui.sandboxes) {
    nav.append(el("div", { class: "sb" + (sb.id === ui.selected ? " sel" : ""), "data-id": sb.id,
      onclick: () => { ui.selected = sb.id; ui.node = null; drawList(); loadDetail(); } },
      el("div", { class: "name" }, sbName(sb), " ", el("span", { class: "state " + sb.state }, sb.state)),
      el("div", { class: "muted mono" }, short(sb.id), " · ", sb.image || "")));
  }
}

async function loadDetail() {
  const id = ui.selected;
  if (!id) { drawDetail(); return; }
  const enc = encodeURIComponent(id);
  const [sb, cks, turns, effects] = await Promise.all([
    api("GET", "/v1/sandboxes/" + enc),
    api("GET", "/v1/sandboxes/" + enc + "/checkpoints"),
    api("GET", "/v1/sandboxes/" + enc + "/turns").catch(() => []),
    api("GET", "/v1/sandboxes/" + enc + "/effects").catch(() => []),
  ]);
  if (id !== ui.selected) return;
  ui.detail = { sb, cks: cks || [], turns: turns || [], effects: effects || [] };
  drawDetail();
}

function drawDetail() {
  const d0 = ui.detail, sb0 = d0 && d0.sb;
  // The sandbox's live figures (memory, processes) are not drawn: they
  // alone do not redraw.
  const sig = JSON.stringify([sb0 && [sb0.id, sb0.name, sb0.state, sb0.reason, sb0.head], d0 && [d0.cks, d0.turns, d0.effects], ui.node, [...ui.collapsed]]);
  if (sig === drawn.detail) return;
  drawn.detail = sig;
  const d = document.getElementById("detail");
  const keepScroll = document.getElementById("tree");
  const top = keepScroll ? keepScroll.scrollTop : 0;
  d.replaceChildren();
  if (!ui.detail) { d.append(el("p", { class: "muted" }, "Select a sandbox.")); return; }
  const { sb, cks, turns, effects } = ui.detail;
  const byTurn = new Map();
  for (const t of turns) if (t.checkpoint) byTurn.set(t.checkpoint, t);
  d.append(el("h2", {}, sbName(sb), " ", el("span", { class: "state " + sb.state }, sb.state)),
    el("div", { class: "muted mono" }, sb.id, sb.reason ? " — " + sb.reason : ""),
    sandboxBar(sb));
  const tree = el("div", { class: "card", id: "tree" });
  tree.append(el("h3", {}, "Checkpoints (" + cks.length + ")"), legend(), drawTree(cks, sb.head, byTurn));
  d.append(el("div", { class: "panes" }, tree, el("div", { class: "card", id: "node" }, nodePanel(sb, byTurn))));
  d.append(el("div", { class: "lower" }, turnLog(turns), ledger(effects)));
  document.getElementById("tree").scrollTop = top;
}

function sandboxBar(sb) {
  const enc = encodeURIComponent(sb.id);
  const bar = el("div", { class: "bar", "data-sandbox": sb.id });
  if (sb.state === "hibernated") {
    bar.append(el("button", { id: "act-resume", onclick: () => confirmAction("Resume " + sbName(sb),
      "Restore the hibernated sandbox's processes.", () => api("POST", "/v1/sandboxes/" + enc + "/resume", {}).then(() => "")) }, "Resume"));
  } else {
    bar.append(el("button", { id: "act-hibernate", onclick: () => confirmAction("Hibernate " + sbName(sb),
      "Checkpoint the sandbox and stop its processes until it is resumed.", () => api("POST", "/v1/sandboxes/" + enc + "/hibernate", {}).then(() => "")) }, "Hibernate"));
  }
  bar.append(el("button", { id: "act-fork-sandbox", onclick: () => confirmAction("Fork " + sbName(sb),
    "Create a new sandbox from this one's current state.", () => api("POST", "/v1/sandboxes/" + enc + "/fork", { n: 1 })
      .then((r) => "new sandbox " + r.sandboxes.map(sbName).join(", "))) }, "Fork"));
  bar.append(el("button", { id: "act-delete", class: "danger", onclick: () => confirmAction("Delete " + sbName(sb),
    "Remove the sandbox, its processes, files and checkpoints. This cannot be undone.", () => api("DELETE", "/v1/sandboxes/" + enc).then(() => "")) }, "Delete"));
  bar.append(el("span", { class: "muted" }, "head ", el("span", { class: "mono" }, short(sb.head) || "none")));
  return bar;
}

function legend() {
  const l = el("div", { class: "legend muted" });
  for (const k of KINDS) l.append(el("span", {}, el("span", { class: "dot k-" + k }), k));
  l.append(el("span", {}, el("span", { class: "dot ring" }), "head"));
  l.append(el("span", {}, "− / + at a branch folds its subtree"));
  return l;
}

// layout orders the checkpoints depth-first (children by creation) and
// gives each a column: a chain stays in its column, a branch point's
// children move one column right, so a long agent run stays narrow.
function layout(cks) {
  const byID = new Map(cks.map((c) => [c.id, c]));
  const kids = new Map();
  const roots = [];
  for (const c of cks) {
    if (c.parent && byID.has(c.parent)) {
      if (!kids.has(c.parent)) kids.set(c.parent, []);
      kids.get(c.parent).push(c);
    } else roots.push(c);
  }
  const byTime = (a, b) => (a.created < b.created ? -1 : a.created > b.created ? 1 : 0);
  const rows = [];
  const visit = (c, col, parentRow) => {
    const ch = (kids.get(c.id) || []).sort(byTime);
    const row = { c, col, parentRow, n: ch.length, hidden: 0 };
    rows.push(row);
    if (ui.collapsed.has(c.id)) { row.hidden = countBelow(c.id, kids); return; }
    const next = ch.length > 1 ? col + 1 : col;
    for (const k of ch) visit(k, next, row);
  };
  roots.sort(byTime).forEach((r) => visit(r, 0, null));
  return rows;
}

function countBelow(id, kids) {
  let n = 0;
  for (const k of kids.get(id) || []) n += 1 + countBelow(k.id, kids);
  return n;
}

function drawTree(cks, head, byTurn) {
  if (!cks.length) return el("p", { class: "muted" }, "No checkpoints yet.");
  const rows = layout(cks);
  rows.forEach((r, i) => (r.y = i * ROW + ROW / 2));
  const maxCol = Math.max(...rows.map((r) => r.col));
  const textX = X0 + (maxCol + 1) * INDENT + 6;
  const s = svg("svg", { class: "tree", width: textX + 620, height: rows.length * ROW + 4 });
  const edges = svg("g"), nodes = svg("g");
  s.append(edges, nodes);
  for (const r of rows) {
    r.x = X0 + r.col * INDENT;
    if (r.parentRow) {
      const p = r.parentRow;
      edges.append(svg("path", { class: "edge", d: `M${p.x},${p.y} V${r.y - (p.x === r.x ? 0 : 6)} ${p.x === r.x ? "" : `Q${p.x},${r.y} ${p.x + 6},${r.y} H${r.x}`}` }));
    }
  }
  rows.forEach((r, i) => nodes.append(treeNode(r, i, head, byTurn, textX)));
  return s;
}

function treeNode(r, i, head, byTurn, textX) {
  const c = r.c, t = byTurn.get(c.id);
  const cls = ["node"];
  if (c.id === head) cls.push("head");
  if (c.id === ui.node) cls.push("sel");
  if (c.pending) cls.push("pending");
  if (c.failed) cls.push("failed");
  const g = svg("g", { class: cls.join(" "), id: "node-" + c.id, "data-id": c.id, "data-label": c.label || "" });
  g.append(svg("rect", { class: "row", x: 0, y: i * ROW, width: "100%", height: ROW }));
  g.append(svg("title", {}, nodeTitle(c, t)));
  g.append(svg("circle", { class: "k-" + (KINDS.includes(c.kind) ? c.kind : "other"), cx: r.x, cy: r.y, r: 5 }));
  let x = textX;
  if (r.n > 1 || ui.collapsed.has(c.id)) {
    const tog = svg("text", { class: "toggle", x: x - 2, y: r.y, "text-anchor": "end" }, ui.collapsed.has(c.id) ? "+" + r.hidden : "−");
    tog.addEventListener("click", (e) => {
      e.stopPropagation();
      ui.collapsed.has(c.id) ? ui.collapsed.delete(c.id) : ui.collapsed.add(c.id);
      drawDetail();
    });
    g.append(tog);
  }
  const lbl = svg("text", { class: "lbl", x: x + 4, y: r.y });
  if (c.id === head) lbl.append(svg("tspan", { class: "headtag" }, "HEAD "));
  lbl.append(document.createTextNode(c.label || short(c.id)));
  g.append(lbl);
  const meta = [c.kind, bytes(c.bytes_written), "stall " + ms(c.stall_ms)];
  if (t) meta.push("turn " + t.turn + " " + t.decision);
  if (c.pending) meta.push("pending");
  if (c.failed) meta.push("failed");
  g.append(svg("text", { class: "meta", x: x + 4 + 170, y: r.y }, meta.join(" · ")));
  g.addEventListener("click", () => { ui.node = c.id; drawDetail(); });
  return g;
}

function nodeTitle(c, t) {
  let s = `${c.id}\nkind ${c.kind}${c.label ? "\nlabel " + c.label : ""}\nsize ${bytes(c.bytes_written)}\nstall ${ms(c.stall_ms)}\ncreated ${c.created}`;
  if (t) s += `\nturn ${t.turn}: ${t.decision}`;
  return s;
}

function nodePanel(sb, byTurn) {
  const frag = el("div");
  const c = ui.detail.cks.find((x) => x.id === ui.node);
  if (!c) {
    frag.append(el("h3", {}, "Checkpoint"), el("p", { class: "muted" }, "Select a node of the tree."));
    return frag;
  }
  const t = byTurn.get(c.id);
  const dl = el("dl");
  const add = (k, v) => { if (v !== undefined && v !== null && v !== "") dl.append(el("dt", {}, k), el("dd", {}, v)); };
  add("id", c.id); add("label", c.label); add("kind", c.kind); add("parent", c.parent);
  add("created", c.created); add("size", bytes(c.bytes_written)); add("stall", ms(c.stall_ms));
  add("duration", ms(c.duration_ms)); add("capture", c.capture); add("note", c.capture_note);
  if (t) { add("turn", String(t.turn)); add("decision", t.decision); add("reasons", (t.reasons || []).join("; ")); }
  if (c.keep) add("keep", "yes");
  if (c.pending) add("pending", "yes");
  if (c.failed) add("failed", c.failed_reason || "yes");
  if (c.id === sb.head) add("head", "yes");
  const enc = encodeURIComponent(sb.id), name = c.label || short(c.id);
  const bar = el("div", { class: "bar" },
    el("button", { id: "act-rollback", class: "danger", onclick: () => confirmAction("Roll back to " + name,
      `Roll ${sbName(sb)} back to checkpoint ${name}: its files and processes return to that state.`,
      () => api("POST", "/v1/sandboxes/" + enc + "/rollback", { checkpoint: c.id }).then((r) => r.tier + " in " + ms(r.duration_ms))) }, "Roll back here"),
    el("button", { id: "act-fork", onclick: () => confirmAction("Fork " + name,
      `Create a new sandbox from checkpoint ${name}.`,
      () => api("POST", "/v1/checkpoints/" + encodeURIComponent(c.id) + "/fork", { n: 1 }).then((r) => "new sandbox " + r.sandboxes.map(sbName).join(", "))) }, "Fork here"));
  frag.append(el("h3", {}, "Checkpoint " + name), dl, bar);
  return frag;
}

function ckName(id) {
  const c = ui.detail.cks.find((x) => x.id === id);
  return (c && c.label) || short(id);
}

function turnLog(turns) {
  const card = el("div", { class: "card", id: "turns" }, el("h3", {}, "Turn log (" + turns.length + ")"));
  if (!turns.length) { card.append(el("p", { class: "muted" }, "No turns.")); return card; }
  const tb = el("tbody");
  for (const t of turns.slice().reverse()) {
    tb.append(el("tr", {}, el("td", {}, t.turn), el("td", {}, t.decision), el("td", { class: "mono" }, t.checkpoint ? ckName(t.checkpoint) : ""),
      el("td", {}, (t.commands || []).length), el("td", {}, ms(t.duration_ms)), el("td", {}, (t.reasons || []).join("; "))));
  }
  card.append(el("table", {}, el("thead", {}, el("tr", {}, ...["turn", "decision", "checkpoint", "cmds", "took", "reasons"].map((h) => el("th", {}, h)))), tb));
  return card;
}

function ledger(effects) {
  const card = el("div", { class: "card", id: "effects" }, el("h3", {}, "Effects ledger (" + effects.length + ")"));
  if (!effects.length) { card.append(el("p", { class: "muted" }, "No effects.")); return card; }
  const tb = el("tbody");
  for (const e of effects.slice().reverse()) {
    tb.append(el("tr", {}, el("td", {}, e.seq), el("td", {}, e.kind), el("td", {}, e.state + (e.orphan ? " (orphan)" : "")),
      el("td", { class: "mono" }, [e.method, e.url || e.host || e.addr].filter(Boolean).join(" ")), el("td", {}, e.turn || ""), el("td", { class: "mono" }, e.checkpoint ? ckName(e.checkpoint) : "")));
  }
  card.append(el("table", {}, el("thead", {}, el("tr", {}, ...["seq", "kind", "state", "what", "turn", "checkpoint"].map((h) => el("th", {}, h)))), tb));
  return card;
}

async function refresh(all) {
  try {
    if (all) await loadList();
    await loadDetail();
  } catch (e) {
    toast(e.message, true);
  }
}

function setLive(on, text) {
  const live = document.getElementById("live");
  live.className = "live " + (on ? "on" : "off");
  live.textContent = text;
}

async function onChange(c) {
  try {
    if (c.all || c.list) await loadList();
    if (c.all || c.list || (c.sandboxes || []).includes(ui.selected)) await loadDetail();
  } catch (e) {
    toast(e.message, true);
  }
}

// listen reads /events (server-sent events) with fetch, since an
// EventSource cannot send the token's header; it reconnects after 2 s.
async function listen() {
  for (;;) {
    try {
      const r = await fetch("/events", { headers: { [TOKEN_HEADER]: token }, credentials: "omit" });
      if (!r.ok) throw new Error(r.status + " " + r.statusText);
      const rd = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await rd.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let ev = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) ev = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (ev === "hello") setLive(true, "live");
          else if (ev === "change") await onChange(JSON.parse(data));
        }
      }
    } catch (e) { /* reconnect below */ }
    setLive(false, "reconnecting");
    await new Promise((res) => setTimeout(res, 2000));
  }
}

async function main() {
  if (!token) {
    document.getElementById("detail").replaceChildren(el("p", {}, "No token: open the URL the daemon logged (http://HOST:PORT/?token=...)."));
    document.getElementById("sandboxes").replaceChildren();
    return;
  }
  try {
    const h = await api("GET", "/v1/host");
    document.getElementById("host").textContent = [h.version && "molt " + h.version, h.kernel && "Linux " + h.kernel, h.root].filter(Boolean).join(" · ");
  } catch (e) { /* the host line is optional */ }
  await refresh(true);
  listen();
}

main();
