// The Palomino dashboard page: the experiment list, the grid as a heat map (live, or replayed with
// the slider), a cell's charts and samples, and a finished run's ranked mixtures.
// Records are kept per cell, keyed by iteration, so an event seen twice (RabbitMQ and the run
// directory both feed the stream) or again after a reload changes nothing.

"use strict";

const $ = (id) => document.getElementById(id);

// ---- access ----------------------------------------------------------------------------------

const TOKEN_KEY = "palomino-dashboard-token";
(function takeTokenFromUrl() {
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    sessionStorage.setItem(TOKEN_KEY, params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
})();
const token = () => sessionStorage.getItem(TOKEN_KEY);

function apiUrl(path) {
  // Relative: the page works behind a reverse proxy that serves it under a prefix.
  const t = token();
  return "api/" + path + (t ? (path.includes("?") ? "&" : "?") + "access_token=" + encodeURIComponent(t) : "");
}

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path) {
  const headers = token() ? { Authorization: "Bearer " + token() } : {};
  const response = await fetch("api/" + path, { headers, cache: "no-store" });
  if (response.status === 401) {
    askForToken();
    throw new ApiError(401, "token needed");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, detail);
  }
  return response.json();
}

function askForToken() {
  const dialog = $("login");
  if (!dialog.open) dialog.showModal();
}
$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("login-token").value);
  $("login").close();
  refreshList();
  route();
});

function notice(text) { $("notice").textContent = text || ""; }

// ---- what the heat map can show ------------------------------------------------------------

const LOSS_COLOURS = { bce: "#4e79a7", mse: "#f28e2b", heuristic: "#59a14f", wgan_gp: "#e15759" };
const OTHER_COLOUR = "#b07aa1";
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function dominantLoss(record) {
  const used = record.losses_used || {};
  let best = null;
  for (const [name, count] of Object.entries(used)) if (best === null || count > used[best]) best = name;
  return best;
}

const METRICS = {
  gfit: { label: "generator fitness", value: (r) => r.generator?.fitness },
  dfit: { label: "discriminator fitness", value: (r) => r.discriminator?.fitness },
  score: { label: "mixture score (MMD²)", value: (r) => r.score, lowerIsBetter: true },
  glr: { label: "learning rate (generator)", value: (r) => r.generator?.learning_rate },
  dlr: { label: "learning rate (discriminator)", value: (r) => r.discriminator?.learning_rate },
  gloss: { label: "generator loss", value: (r) => r.generator?.loss },
  dloss: { label: "discriminator loss", value: (r) => r.discriminator?.loss },
  loss: { label: "loss in use", categorical: true },
  lag: { label: "iteration lag (behind the newest)", lowerIsBetter: true },
  alive: { label: "alive / dead", categorical: true },
};
const NUMERIC = Object.keys(METRICS).filter((k) => METRICS[k].value);

function viridis(t) {
  t = Math.min(1, Math.max(0, t));
  const x = t * (VIRIDIS.length - 1), i = Math.min(VIRIDIS.length - 2, Math.floor(x)), f = x - i;
  const c = VIRIDIS[i].map((v, k) => Math.round(v + (VIRIDIS[i + 1][k] - v) * f));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}
function isDark(rgb) {
  const m = rgb.match(/\d+/g);
  if (!m) return false;
  const [r, g, b] = m.map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b < 140;
}
// Tick labels precise enough to tell neighbouring ticks apart (learning rates differ in the 4th digit).
function ticks(splits) {
  const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) || 1 : 1;
  const big = Math.max(...splits.map(Math.abs));
  if (big !== 0 && (big < 1e-2 || big >= 1e5)) {
    const digits = Math.min(6, Math.max(0, Math.ceil(Math.log10(big / step))));
    return splits.map((v) => v.toExponential(digits));
  }
  const decimals = Math.min(8, Math.max(0, -Math.floor(Math.log10(step))));
  return splits.map((v) => v.toFixed(decimals));
}

// Wide enough for the longest tick label (e.g. 1.9995e-4), so none is clipped.
function axisWidth(u, values) {
  const longest = Math.max(3, ...(values || []).map((v) => String(v).length));
  return Math.ceil(longest * 7 + 22);
}

function scoreText(entry) {
  if (!entry) return "";
  if (entry.error) return "error: " + entry.error;
  return Object.entries(entry)
    .filter(([k]) => k !== "scorer" && k !== "iteration")
    .map(([k, v]) => `${k} ${typeof v === "number" ? fmt(v) : JSON.stringify(v)}`).join(", ");
}

function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : Number(v.toPrecision(3)).toString();
}

// ---- one experiment's data -----------------------------------------------------------------

class Experiment {
  constructor(id) {
    this.id = id;
    this.summary = null;
    this.layouts = [];
    this.cells = new Map(); // "r-c" → {iterations: [], records: []}, sorted by iteration
    this.maxIteration = -1;
    this.domain = Object.fromEntries(NUMERIC.map((k) => [k, [Infinity, -Infinity]]));
    this.targetScores = {}; // the scorer's results: "best" or "r-c" → {metric: value} (or {error})
  }

  add(record) {
    if (!record || !Array.isArray(record.cell) || typeof record.iteration !== "number") return false;
    const key = record.cell.join("-");
    let cell = this.cells.get(key);
    if (!cell) this.cells.set(key, (cell = { iterations: [], records: [] }));
    const its = cell.iterations, n = its.length, it = record.iteration;
    if (n === 0 || its[n - 1] < it) {
      its.push(it); cell.records.push(record);
    } else {
      const i = lowerBound(its, it);
      if (its[i] === it) cell.records[i] = record; // a redo after a restore replaces the old record
      else { its.splice(i, 0, it); cell.records.splice(i, 0, record); }
    }
    if (it > this.maxIteration) this.maxIteration = it;
    for (const k of NUMERIC) {
      const v = METRICS[k].value(record);
      if (typeof v === "number" && Number.isFinite(v)) {
        const d = this.domain[k];
        if (v < d[0]) d[0] = v;
        if (v > d[1]) d[1] = v;
      }
    }
    return true;
  }

  // The newest record of a cell at or before `iteration`.
  at(key, iteration) {
    const cell = this.cells.get(key);
    if (!cell || cell.iterations.length === 0) return null;
    const i = upperBound(cell.iterations, iteration) - 1;
    return i >= 0 ? cell.records[i] : null;
  }

  layout(iteration, follow) {
    const latest = this.layouts.length ? this.layouts[this.layouts.length - 1] : null;
    if (follow || !latest) return latest || this.summaryLayout();
    // Replaying: the layout of the newest epoch any cell had reached by then.
    let epoch = 0;
    for (const key of this.cells.keys()) {
      const r = this.at(key, iteration);
      if (r && (r.epoch || 0) > epoch) epoch = r.epoch || 0;
    }
    let chosen = this.layouts[0];
    for (const l of this.layouts) if ((l.epoch || 0) <= epoch) chosen = l;
    return chosen;
  }

  summaryLayout() {
    const s = this.summary || {};
    return s.rows ? { epoch: s.epoch || 0, rows: s.rows, cols: s.cols, cells: s.cells || {} } : null;
  }

  setLayout(layout) {
    if (!layout || !layout.rows) return;
    const i = this.layouts.findIndex((l) => (l.epoch || 0) === (layout.epoch || 0));
    if (i >= 0) this.layouts[i] = layout; else this.layouts.push(layout);
    this.layouts.sort((a, b) => (a.epoch || 0) - (b.epoch || 0));
  }
}

function lowerBound(a, x) { let lo = 0, hi = a.length; while (lo < hi) { const m = (lo + hi) >> 1; if (a[m] < x) lo = m + 1; else hi = m; } return lo; }
function upperBound(a, x) { let lo = 0, hi = a.length; while (lo < hi) { const m = (lo + hi) >> 1; if (a[m] <= x) lo = m + 1; else hi = m; } return lo; }

// ---- page state ----------------------------------------------------------------------------

const view = {
  experiments: [],
  exp: null, // Experiment
  follow: true,
  iteration: 0,
  metric: localStorage.getItem("palomino-metric") || "gfit",
  cell: null, // "r-c" shown in the side panel
  stream: null,
  pending: null, // events that arrived while the history loaded
  tiles: new Map(),
  tileShape: "",
  charts: {},
  chartKeys: "",
  samplesCheckedAt: 0,
  resultShownFor: null,
};
// For benchmarks and tests: what the page has received and drawn.
window.palomino = { events: 0, batches: 0, frames: 0, lastBatchAt: 0 };

if (!METRICS[view.metric]) view.metric = "gfit";
$("metric").value = view.metric;

// ---- the experiment list -------------------------------------------------------------------

async function refreshList() {
  let answer;
  try {
    answer = await api("experiments");
  } catch (error) {
    if (error.status !== 401) notice("cannot list experiments: " + error.message);
    return;
  }
  const problems = Object.values(answer.unavailable || {});
  notice(problems.join("; "));
  view.experiments = answer.experiments;
  const list = $("experiment-list");
  list.replaceChildren(...answer.experiments.map((s) => {
    const li = document.createElement("li");
    const a = document.createElement("a");
    a.href = "#/exp/" + encodeURIComponent(s.id);
    a.dataset.experiment = s.id;
    if (view.exp && view.exp.id === s.id) a.classList.add("current");
    const name = document.createElement("span");
    name.textContent = s.id;
    const meta = document.createElement("span");
    meta.className = "meta";
    const grid = s.rows ? `${s.rows}×${s.cols}` : "not started";
    meta.textContent = `${s.state} · ${grid} · ${s.records} records`;
    a.append(name, meta);
    li.append(a);
    return li;
  }));
  $("no-experiments").hidden = answer.experiments.length > 0;
}

// ---- routing: #/exp/<id> and #/exp/<id>/cell/<r-c> ----------------------------------------

function route() {
  const m = location.hash.match(/^#\/exp\/([^/]+)(?:\/cell\/(\d+-\d+))?$/);
  if (!m) {
    closeExperiment();
    if (view.experiments.length === 1) location.hash = "#/exp/" + encodeURIComponent(view.experiments[0].id);
    return;
  }
  const id = decodeURIComponent(m[1]);
  if (!view.exp || view.exp.id !== id) openExperiment(id);
  selectCell(m[2] || null);
}
window.addEventListener("hashchange", route);

function closeExperiment() {
  if (view.stream) view.stream.close();
  view.stream = null;
  view.exp = null;
  $("experiment").hidden = true;
  $("cell").hidden = true;
  $("empty").hidden = false;
  setStream(false, "offline");
}

async function openExperiment(id) {
  closeExperiment();
  const exp = new Experiment(id);
  view.exp = exp;
  view.follow = true;
  view.resultShownFor = null;
  view.tileShape = "";
  $("empty").hidden = true;
  $("experiment").hidden = false;
  $("result").hidden = true;
  $("exp-title").textContent = id;
  for (const a of document.querySelectorAll("#experiment-list a")) a.classList.toggle("current", a.dataset.experiment === id);
  openStream(exp);
  await loadHistory(exp);
}

async function loadHistory(exp) {
  view.pending = view.pending || [];
  try {
    const [summary, topology] = await Promise.all([api(`experiments/${enc(exp.id)}`), api(`experiments/${enc(exp.id)}/topology`)]);
    if (view.exp !== exp) return;
    exp.summary = summary;
    for (const layout of topology.layouts) exp.setLayout(layout);
    let since = 0;
    for (;;) {
      const page = await api(`experiments/${enc(exp.id)}/metrics?since=${since}`);
      if (view.exp !== exp) return;
      for (const record of page.records) exp.add(record);
      if (page.next <= since || page.next >= (page.total ?? page.next)) break;
      since = page.next;
    }
  } catch (error) {
    if (view.exp === exp) {
      $("exp-info").textContent = error.status === 404 ? `no experiment ${exp.id}` : "cannot load: " + error.message;
    }
    return;
  } finally {
    const pending = view.pending || [];
    view.pending = null;
    if (view.exp === exp) for (const event of pending) apply(exp, event);
  }
  render();
}
const enc = encodeURIComponent;

// ---- live events (Server-Sent Events) ------------------------------------------------------

function setStream(on, text) {
  const el = $("stream");
  el.classList.toggle("on", on);
  el.classList.toggle("off", !on);
  el.textContent = "● " + text;
}

function openStream(exp) {
  let opened = false;
  const stream = new EventSource(apiUrl(`events?experiment=${enc(exp.id)}`));
  view.stream = stream;
  stream.addEventListener("hello", () => {
    setStream(true, "live");
    if (opened) { view.pending = []; loadHistory(exp); } // reconnected: fill the gap
    opened = true;
  });
  stream.addEventListener("events", (message) => {
    if (view.exp !== exp) return;
    const events = JSON.parse(message.data);
    window.palomino.batches += 1;
    window.palomino.events += events.length;
    window.palomino.lastBatchAt = Date.now();
    for (const event of events) {
      if (view.pending) view.pending.push(event);
      else apply(exp, event);
    }
  });
  stream.onerror = () => setStream(false, "reconnecting…");
}

function apply(exp, event) {
  switch (event.kind) {
    case "metrics":
      if (exp.add(event.record) && view.cell === event.record.cell.join("-")) view.cellDirty = true;
      break;
    case "topology": {
      const { experiment, kind, ...summary } = event;
      exp.summary = { ...(exp.summary || {}), ...summary };
      exp.setLayout({ epoch: summary.epoch || 0, rows: summary.rows, cols: summary.cols, cells: summary.cells || {} });
      view.listDirty = true;
      break;
    }
    case "state":
      exp.summary = { ...(exp.summary || {}), state: event.state, reason: event.reason || "" };
      view.listDirty = true;
      break;
    case "score":
      if (typeof event.target === "string") {
        exp.targetScores[event.target] = event.error ? { error: event.error } : { ...(event.scores || {}), iteration: event.iteration };
      }
      view.resultShownFor = null; // scores.json has changed: show the result again
      if (view.cell === event.target) view.cellDirty = true;
      break;
    case "reload":
    case "resync":
      view.pending = [];
      loadHistory(exp);
      return;
    default:
      return; // a kind this page does not know yet
  }
  scheduleRender();
}

// ---- drawing -------------------------------------------------------------------------------

// At most a few frames a second: a 12×12 grid sends ~144 records a second, and nobody reads
// a heat map faster than that; the browser stays mostly idle between frames.
const FRAME_MS = 250;
let frameRequested = false, lastFrame = 0;
function scheduleRender() {
  if (frameRequested) return;
  frameRequested = true;
  setTimeout(() => requestAnimationFrame(() => {
    frameRequested = false;
    lastFrame = performance.now();
    render();
  }), Math.max(0, lastFrame + FRAME_MS - performance.now()));
}

function setText(el, text) { if (el.textContent !== text) el.textContent = text; }

function render() {
  const exp = view.exp;
  if (!exp || !exp.summary) return;
  window.palomino.frames += 1;
  const s = exp.summary;
  const state = $("exp-state");
  state.textContent = s.state;
  state.className = "state " + s.state;
  const iterations = s.iterations ? ` of ${s.iterations}` : "";
  const failures = (s.failures || []).map((f) => `${f.cell} ${f.action}${f.by ? " by " + f.by : ""}${f.to ? " to " + f.to : ""}`);
  setText($("exp-info"), [
    `${s.name || ""}`,
    s.rows ? `grid ${s.rows}×${s.cols}, epoch ${s.epoch ?? 0}` : "waiting for workers",
    `newest iteration ${exp.maxIteration >= 0 ? exp.maxIteration : "–"}${iterations}`,
    `${s.source || ""}`,
    s.reason ? `reason: ${s.reason}` : "",
    failures.length ? `failures: ${failures.join(", ")}` : "",
  ].filter(Boolean).join(" · "));

  const slider = $("iteration");
  if (view.follow) view.iteration = Math.max(0, exp.maxIteration);
  if (slider.max !== String(Math.max(0, exp.maxIteration))) slider.max = Math.max(0, exp.maxIteration);
  if (slider.value !== String(view.iteration)) slider.value = view.iteration;
  setText($("iteration-value"), exp.maxIteration >= 0 ? String(view.iteration) : "–");
  $("follow").classList.toggle("on", view.follow);

  drawHeatmap(exp);
  if (view.cell && (view.cellDirty || !view.follow)) drawCell(exp);
  view.cellDirty = false;
  if (view.listDirty) { view.listDirty = false; refreshList(); }
  if (s.state === "finished" && view.resultShownFor !== exp.id) showResult(exp);
}

function drawHeatmap(exp) {
  const layout = exp.layout(view.iteration, view.follow);
  const map = $("heatmap");
  if (!layout) { map.replaceChildren(); view.tiles.clear(); view.tileShape = ""; return; }
  const shape = `${layout.epoch || 0}:${layout.rows}x${layout.cols}`;
  if (shape !== view.tileShape) {
    // A new layout (start, resize): redraw the tiles.
    view.tileShape = shape;
    view.tiles.clear();
    map.style.gridTemplateColumns = `repeat(${layout.cols}, 1fr)`;
    const tiles = [];
    for (let r = 0; r < layout.rows; r++) for (let c = 0; c < layout.cols; c++) {
      const key = `${r}-${c}`;
      const tile = document.createElement("div");
      tile.className = "tile" + (layout.rows * layout.cols > 36 ? " small" : "");
      tile.dataset.cell = key;
      tile.setAttribute("role", "gridcell");
      tile.innerHTML = `<span class="coord">${key}</span><span class="value"></span><span class="iter"></span>`;
      tile.addEventListener("click", () => { location.hash = `#/exp/${enc(exp.id)}/cell/${key}`; });
      tiles.push(tile);
      view.tiles.set(key, tile);
    }
    map.replaceChildren(...tiles);
    const first = exp.layouts[0];
    $("layout-note").textContent = exp.layouts.length > 1
      ? `layout ${layout.rows}×${layout.cols} (epoch ${layout.epoch || 0}); started as ${first.rows}×${first.cols}; ${exp.layouts.length - 1} change(s)`
      : "";
  }

  const metric = METRICS[view.metric];
  const liveness = view.follow && exp.summary.state === "running" ? exp.summary.liveness || {} : {};
  const workers = layout.cells || {};
  let newest = -1;
  const records = new Map();
  for (const key of view.tiles.keys()) {
    const record = exp.at(key, view.iteration);
    records.set(key, record);
    if (record && record.iteration > newest) newest = record.iteration;
  }
  let domain = exp.domain[view.metric];
  if (!metric.value) { // lag: 0 … how far the slowest shown cell is behind the newest
    let oldest = newest;
    for (const r of records.values()) if (r && r.iteration < oldest) oldest = r.iteration;
    domain = [0, Math.max(1, newest - oldest)];
  }
  for (const [key, tile] of view.tiles) {
    const record = records.get(key);
    const worker = workers[key];
    const dead = worker !== undefined && liveness[worker] === false;
    tile.classList.toggle("dead", dead);
    tile.classList.toggle("selected", key === view.cell);
    let colour = null, text = "";
    if (view.metric === "alive") {
      colour = dead ? "#d62728" : worker !== undefined || record ? "#2ca02c" : null;
      text = dead ? "dead" : worker || "";
    } else if (record) {
      if (view.metric === "loss") {
        const loss = dominantLoss(record);
        colour = loss ? LOSS_COLOURS[loss] || OTHER_COLOUR : null;
        text = loss || "–";
      } else if (view.metric === "lag") {
        const lag = newest - record.iteration;
        colour = viridis(1 - lag / Math.max(1, domain[1]));
        text = String(lag);
      } else {
        const v = metric.value(record);
        if (typeof v === "number" && Number.isFinite(v)) {
          const span = domain[1] - domain[0];
          let t = span > 0 ? (v - domain[0]) / span : 0.5;
          if (metric.lowerIsBetter) t = 1 - t;
          colour = viridis(t);
        }
        text = fmt(v);
      }
    }
    // Only what changed is written: each write costs the browser a style recalculation.
    tile.classList.toggle("waiting", colour === null);
    const background = colour || "";
    if (tile.dataset.colour !== background) {
      tile.dataset.colour = background;
      tile.style.backgroundColor = background;
      tile.classList.toggle("light", colour !== null && isDark(colour));
    }
    const iteration = record ? String(record.iteration) : "";
    if (tile.dataset.iteration !== iteration) tile.dataset.iteration = iteration;
    const title = `cell ${key}${worker ? " · " + worker : ""}${record ? " · iteration " + record.iteration : " · no record yet"}${dead ? " · dead" : ""}`;
    if (tile.title !== title) tile.title = title;
    setText(tile.children[1], text);
    setText(tile.children[2], record ? "it " + record.iteration : "");
  }
  drawLegend(exp, domain);
}

function drawLegend(exp, domain) {
  const metric = METRICS[view.metric];
  let html;
  if (view.metric === "loss") {
    html = "<strong>loss in use</strong><br>" + Object.entries(LOSS_COLOURS)
      .map(([name, c]) => `<div><span class="swatch" style="background:${c}"></span>${name}</div>`).join("");
  } else if (view.metric === "alive") {
    html = `<strong>alive / dead</strong><div><span class="swatch" style="background:#2ca02c"></span>alive</div>`
      + `<div><span class="swatch" style="background:#d62728"></span>dead (no heartbeat)</div>`;
  } else {
    const low = metric.lowerIsBetter ? 1 : 0;
    const stops = [0, 0.25, 0.5, 0.75, 1].map((t) => viridis(Math.abs(low - t))).reverse().join(", ");
    const [min, max] = domain;
    html = `<strong>${metric.label}</strong><div class="scale"><div class="bar" style="background: linear-gradient(${stops})"></div>`
      + `<div class="ends"><span>${fmt(max === -Infinity ? null : max)}</span><span>${fmt(min === Infinity ? null : min)}</span></div></div>`
      + (metric.lowerIsBetter ? `<div class="muted">lower is better (brighter)</div>` : "");
  }
  if (view.legend !== html) { view.legend = html; $("legend").innerHTML = html; }
}

// ---- a cell's details ----------------------------------------------------------------------

function selectCell(key) {
  view.cell = key;
  $("cell").hidden = !key;
  if (!key || !view.exp) return;
  $("cell-title").textContent = `cell ${key}`;
  view.samplesCheckedAt = 0;
  view.chartKeys = "";
  view.cellDirty = true;
  scheduleRender();
}
$("cell-close").addEventListener("click", () => { if (view.exp) location.hash = `#/exp/${enc(view.exp.id)}`; });

const SERIES_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];

function drawCell(exp) {
  const key = view.cell;
  const cell = exp.cells.get(key) || { iterations: [], records: [] };
  const records = cell.records;
  const last = exp.at(key, view.iteration);
  const worker = (exp.layout(view.iteration, view.follow)?.cells || {})[key];
  setText($("cell-info"), last
    ? `iteration ${last.iteration} · epoch ${last.epoch ?? 0}${worker ? " · worker " + worker : ""} · losses used ${JSON.stringify(last.losses_used || {})}`
      + (last.seconds ? ` · train ${fmt(last.seconds.train)} s, wait ${fmt(last.seconds.wait)} s` : "")
      + (exp.targetScores[key] ? ` · scorer: ${scoreText(exp.targetScores[key])}` : "")
    : "no record yet");

  const x = cell.iterations;
  const col = (f) => records.map((r) => { const v = f(r); return typeof v === "number" && Number.isFinite(v) ? v : null; });
  const mixtureKeys = [...new Set(records.flatMap((r) => Object.keys(r.mixture || {})))].sort();
  const definitions = {
    "chart-loss": { title: "losses", series: [["generator", (r) => r.generator?.loss], ["discriminator", (r) => r.discriminator?.loss]] },
    "chart-fitness": { title: "fitness", series: [["generator", (r) => r.generator?.fitness], ["discriminator", (r) => r.discriminator?.fitness]] },
    "chart-lr": { title: "learning rates", series: [["generator", (r) => r.generator?.learning_rate], ["discriminator", (r) => r.discriminator?.learning_rate]] },
    "chart-score": { title: "mixture score (MMD², lower is better)", series: [["score", (r) => r.score]] },
    "chart-mixture": { title: "mixture weights", series: mixtureKeys.map((k) => [k, (r) => (r.mixture || {})[k] ?? null]) },
  };
  const shape = key + "|" + mixtureKeys.join(",");
  const rebuild = shape !== view.chartKeys || !window.uPlot;
  if (rebuild) {
    for (const chart of Object.values(view.charts)) chart.destroy();
    view.charts = {};
    view.chartKeys = shape;
  }
  if (!window.uPlot) return; // the library script is still loading: the next frame draws
  const width = Math.max(280, $("cell").clientWidth - 30);
  for (const [id, def] of Object.entries(definitions)) {
    const data = [x, ...def.series.map(([, f]) => col(f))];
    if (view.charts[id]) { view.charts[id].setData(data); continue; }
    const options = {
      title: def.title, width, height: 170,
      scales: { x: { time: false } },
      legend: { live: false },
      cursor: { points: { show: false } },
      series: [{ label: "iteration" }, ...def.series.map(([label], i) => ({
        label, stroke: SERIES_COLOURS[i % SERIES_COLOURS.length], width: 1.5, spanGaps: true, points: { show: false },
      }))],
      axes: [{ space: 40 }, { size: axisWidth, space: 24, values: (u, splits) => ticks(splits) }],
    };
    view.charts[id] = new uPlot(options, data, $(id));
  }
  updateSamples(exp, key);
}

async function updateSamples(exp, key) {
  const now = Date.now();
  if (now - view.samplesCheckedAt < 3000) return; // new PNGs come every `sample_every` iterations
  view.samplesCheckedAt = now;
  let answer;
  try {
    answer = await api(`experiments/${enc(exp.id)}/cells/${key}/samples`);
  } catch (_) { return; }
  if (view.exp !== exp || view.cell !== key) return;
  // A PNG is named after the iterations done: iter-N follows record N-1.
  const wanted = view.follow ? Infinity : view.iteration + 1;
  const chosen = answer.iterations.filter((n) => n <= wanted).pop();
  const img = $("cell-samples");
  if (chosen === undefined) {
    img.removeAttribute("src");
    $("cell-samples-caption").textContent = "no samples yet";
  } else {
    const src = apiUrl(`experiments/${enc(exp.id)}/cells/${key}/samples/${chosen}.png`);
    if (img.getAttribute("src") !== src) img.src = src;
    $("cell-samples-caption").textContent = `generated after ${chosen} iterations`;
  }
  showReal($("cell-real"), $("cell-real-figure"), exp);
}

function showReal(img, figure, exp) {
  const src = apiUrl(`experiments/${enc(exp.id)}/samples/real.png`);
  if (img.getAttribute("src") === src) return;
  img.onerror = () => { figure.hidden = true; };
  img.onload = () => { figure.hidden = false; };
  img.src = src;
}

// ---- a finished experiment's result --------------------------------------------------------

async function showResult(exp) {
  view.resultShownFor = exp.id;
  let result;
  try {
    result = await api(`experiments/${enc(exp.id)}/result`);
  } catch (_) { return; }
  if (view.exp !== exp || !result.ranking) return;
  $("result").hidden = false;
  const img = $("result-samples");
  img.src = apiUrl(`experiments/${enc(exp.id)}/result/samples.png`);
  img.parentElement.hidden = !result.samples;
  showReal($("result-real"), $("result-real-figure"), exp);
  const targets = result.scores?.targets || {};
  for (const [target, entry] of Object.entries(targets)) exp.targetScores[target] = entry;
  const scored = Object.keys(targets).length > 0;
  $("best-scores").textContent = targets.best ? "result, scorer: " + scoreText(targets.best) : "";
  $("ensemble").textContent = ensembleText(result.ranking.ensemble);
  const rows = (result.ranking.ranking || []).map((entry, i) => {
    const tr = document.createElement("tr");
    const weights = (entry.components || []).map((c, k) => `${c}: ${fmt(entry.weights?.[k])}`).join(", ");
    const texts = [String(i + 1), entry.cell, fmt(entry.score), weights];
    if (scored) texts.push(scoreText(targets[entry.cell]));
    for (const text of texts) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    tr.addEventListener("click", () => { location.hash = `#/exp/${enc(exp.id)}/cell/${entry.cell}`; });
    return tr;
  });
  $("ranking").tBodies[0].replaceChildren(...rows);
  const head = $("ranking").tHead.rows[0];
  head.cells[2].textContent = result.ranking.score || "score";
  if (scored && head.cells.length === 4) head.insertCell().outerHTML = "<th>scorer</th>";
  $("scores-box").hidden = !result.scores;
  $("scores").textContent = result.scores ? JSON.stringify(result.scores, null, 2) : "";
}

// The whole grid's ensemble: which cells it uses, with what weight, and its held-out score.
function ensembleText(ensemble) {
  if (!ensemble || !ensemble.cells) return "result: the best cell's neighbourhood mixture";
  const used = ensemble.cells
    .map((cell, i) => [cell, ensemble.weights[i]])
    .filter(([, w]) => w > 0)
    .sort((a, b) => b[1] - a[1]);
  const parts = used.map(([cell, w]) => `${cell} (${fmt(w)})`).join(", ");
  return `result: the grid's ensemble of ${used.length} of ${ensemble.cells.length} cells: ${parts}; ` +
    `held-out ${ensemble.score_name} ${fmt(ensemble.held_out_score)} (equal weights ${fmt(ensemble.equal_weight_score)})`;
}

// ---- controls ------------------------------------------------------------------------------

$("metric").addEventListener("change", (event) => {
  view.metric = event.target.value;
  localStorage.setItem("palomino-metric", view.metric);
  render();
});
$("iteration").addEventListener("input", (event) => {
  view.follow = false;
  view.iteration = Number(event.target.value);
  view.samplesCheckedAt = 0;
  render();
});
$("follow").addEventListener("click", () => {
  view.follow = true;
  view.samplesCheckedAt = 0;
  view.cellDirty = true;
  render();
});
window.addEventListener("load", () => { view.cellDirty = true; scheduleRender(); }); // uPlot is deferred

// Liveness and failures are not events: while an experiment runs, its summary is asked for again.
async function refreshSummary() {
  const exp = view.exp;
  if (!exp || !exp.summary || ["finished", "failed", "stopped"].includes(exp.summary.state)) return;
  let summary;
  try {
    summary = await api(`experiments/${enc(exp.id)}`);
  } catch (_) { return; }
  if (view.exp !== exp) return;
  exp.summary = summary;
  const latest = exp.layouts[exp.layouts.length - 1];
  if (summary.rows && (!latest || (latest.epoch || 0) !== (summary.epoch || 0))) {
    exp.setLayout({ epoch: summary.epoch || 0, rows: summary.rows, cols: summary.cols, cells: summary.cells || {} });
  }
  scheduleRender();
}

// ---- start ---------------------------------------------------------------------------------

(async function start() {
  await refreshList();
  route();
  setInterval(refreshList, 5000);
  setInterval(refreshSummary, 2000);
})();
