// ledgerq dashboard: polls the gateway every two seconds; no framework, no build step.
"use strict";

const REFRESH_MS = 2000;
const STATUSES = ["none", "Pending", "Delayed", "Unknown", "Invalid", "Committed"];
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("token")) {
  sessionStorage.setItem("ledgerq-token", fragment.get("token"));
  // Out of the address bar at once: not left in the history, a bookmark or a shared screen.
  fragment.delete("token");
  const rest = fragment.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
}

function headers() {
  const token = sessionStorage.getItem("ledgerq-token");
  return token ? { Authorization: "Bearer " + token } : {};
}

async function getJson(path) {
  const response = await fetch(path, { headers: headers(), cache: "no-store" });
  if (response.status === 401) {
    document.getElementById("token-box").hidden = false;
    throw new Error("unauthorized");
  }
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function short(id) { return id ? (id.length > 16 ? id.slice(0, 16) + "…" : id) : "–"; }
function ago(ms) {
  if (ms == null) return "–";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 60 ? s + " s ago" : s < 3600 ? Math.round(s / 60) + " min ago" : Math.round(s / 3600) + " h ago";
}

function fill(tableId, rows, empty, columns) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren();
  if (!rows.length) {
    body.append(el("tr", { class: "empty" }, el("td", { colspan: String(columns) }, empty)));
    return;
  }
  for (const r of rows) body.append(r);
}

function renderCounts(counts) {
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const box = document.getElementById("counts");
  box.replaceChildren(
    el("div", { class: "card" }, el("div", { class: "label" }, "total"), el("div", { class: "value" }, String(total))),
    ...STATUSES.map((s) =>
      el("div", { class: "card " + s },
        el("div", { class: "label" }, s === "none" ? "queued" : s),
        el("div", { class: "value" + (counts[s] ? "" : " zero"), "data-status": s }, String(counts[s] || 0))))
  );
}

function renderChart(tp) {
  const svg = document.getElementById("chart");
  const n = tp.accepted.length;
  const max = Math.max(1, ...tp.accepted, ...tp.final);
  const w = 600 / n;
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  tp.accepted.forEach((a, i) => {
    for (const [value, cls, offset] of [[a, "accepted", 0], [tp.final[i], "final", w / 2]]) {
      if (!value) continue;
      const h = (value / max) * 110;
      const rect = document.createElementNS(ns, "rect");
      rect.setAttribute("x", String(i * w + offset));
      rect.setAttribute("y", String(120 - h));
      rect.setAttribute("width", String(Math.max(w / 2, 0.6)));
      rect.setAttribute("height", String(h));
      rect.setAttribute("class", cls);
      svg.append(rect);
    }
  });
  const last = (xs, k) => xs.slice(-k).reduce((a, b) => a + b, 0) / k;
  document.getElementById("rates").textContent =
    "last 10 s: " + last(tp.accepted, 10).toFixed(1) + " accepted/s, " + last(tp.final, 10).toFixed(1) +
    " final/s · last minute: " + last(tp.final, 60).toFixed(1) + " final/s · peak " + max + "/s";
}

// The services last shown, by id: what the control buttons act on.
let shownServices = {};

function renderServices(services) {
  shownServices = Object.fromEntries(services.map((s) => [s.service_id, s]));
  const sorted = [...services].sort((a, b) => b.queue_depth - a.queue_depth || a.service_id.localeCompare(b.service_id));
  const shown = sorted.slice(0, 25);
  document.getElementById("services-note").textContent =
    services.length > shown.length ? "(" + shown.length + " deepest of " + services.length + ")" : "(" + services.length + ")";
  fill("services", shown.map((s) => el("tr", {},
    el("td", { class: "id" }, s.service_id),
    el("td", {}, s.strategy || "serial"),
    el("td", { class: "num" }, String(s.queue_depth)),
    el("td", { class: "num", title: s.in_flight_batch_id || "" }, String(s.in_flight ?? (s.in_flight_batch_id ? 1 : 0))),
    el("td", { class: "id", title: s.blocked_by ? s.blocked_by.kind + " " + s.blocked_by.on : "" },
      s.blocked_by ? short(s.blocked_by.batch_id) + " (" + s.blocked_by.kind + " " + short(s.blocked_by.on) + ")" : "–"),
    el("td", { class: "id" }, s.claimant || "–"),
    el("td", { class: s.ledger_problem ? "error" : "" }, serviceState(s)),
    stateCell(s),
    controlCell(s))), "no services yet — submit a batch", 9);
}

// What stops the service, if anything: halted, paused, waiting for a declared dependency.
function stateCell(s) {
  let state = "running";
  let why = "";
  if (s.halted) {
    state = "halted";
    why = "halted at batch " + s.halted.batch_id + ": " + (s.halted.reason || "") + " (" + ago(s.halted.at) + ")";
  } else if (s.paused) {
    state = "paused";
    why = "paused by " + (s.paused.by || "?") + " (" + ago(s.paused.at) + ")";
  } else if (s.waits_for) {
    state = "waiting";
    why = s.waits_for;
  }
  return el("td", {}, el("span", { class: "state " + state, title: why }, state));
}

function controlCell(s) {
  const buttons = [];
  const add = (action, label, title) => buttons.push(el("button",
    { type: "button", class: "act", "data-action": action, "data-service": s.service_id, title }, label));
  if (s.paused) add("resume", "resume", "submit this service's batches again");
  else add("pause", "pause", "submit nothing new of this service");
  if (s.halted) add("skip", "skip", "resume past its INVALID batch " + s.halted.batch_id);
  if (s.queue_depth > 0) add("cancel", "cancel…", "choose queued batches to cancel");
  return el("td", { class: "controls" }, ...buttons);
}

function servicePath(serviceId, action) {
  return "/services/" + encodeURIComponent(serviceId) + (action ? "/" + action : "");
}

async function postJson(path, body) {
  const init = { method: "POST", headers: headers(), cache: "no-store" };
  if (body !== null) {
    init.headers = { ...init.headers, "Content-Type": "application/json" };
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const doc = await response.json().catch(() => null);
  if (!response.ok) throw new Error(doc && doc.error ? doc.error.message : path + ": HTTP " + response.status);
  return doc;
}

// The action waiting for its confirmation: {action, serviceId, body}.
let pending = null;

function say(text, failed) {
  const line = document.getElementById("action-result");
  line.textContent = text;
  line.className = failed ? "error" : "muted";
}

async function ask(action, serviceId) {
  const s = shownServices[serviceId] || { service_id: serviceId };
  const question = document.getElementById("action-question");
  const list = document.getElementById("action-batches");
  const confirm = document.getElementById("action-confirm");
  list.replaceChildren();
  confirm.disabled = false;
  let body = null;
  if (action === "pause") {
    question.textContent = "Pause service " + serviceId + "? Nothing new of it is submitted; what is in flight is followed to its end.";
  } else if (action === "resume") {
    question.textContent = "Resume service " + serviceId + "? Its queued batches are submitted again, in order.";
  } else if (action === "skip") {
    const halted = s.halted || {};
    body = { batch_id: halted.batch_id };
    question.textContent = "Resume service " + serviceId + " past its INVALID batch " + halted.batch_id +
      " (" + (halted.reason || "no reason recorded") + ")? Its next batches are submitted.";
  } else if (action === "cancel") {
    let queued = [];
    try {
      queued = (await getJson(servicePath(serviceId) + "?limit=1")).data.queued;
    } catch (err) {
      say("cannot list the queued batches of " + serviceId + ": " + err.message, true);
      return;
    }
    for (const id of queued) {
      list.append(el("li", {}, el("label", {},
        el("input", { type: "checkbox", value: id, checked: "" }), " " + id)));
    }
    question.textContent = queued.length
      ? "Cancel the checked batches of service " + serviceId + "? They become final (INVALID) and are never submitted." +
        (s.paused ? "" : " Pause the service first, so that none is taken meanwhile.")
      : "Service " + serviceId + " has no batch that can be cancelled now (all are with the submitter or the ledger).";
    confirm.disabled = !queued.length;
  }
  pending = { action, serviceId, body };
  document.getElementById("action-box").hidden = false;
  confirm.focus();
}

function dismiss() {
  pending = null;
  document.getElementById("action-box").hidden = true;
}

async function confirmPending() {
  if (pending === null) return;
  const { action, serviceId } = pending;
  let body = pending.body;
  if (action === "cancel") {
    const ids = [...document.querySelectorAll("#action-batches input:checked")].map((i) => i.value);
    if (!ids.length) {
      say("check at least one batch to cancel", true);
      return;
    }
    body = { batch_ids: ids };
  }
  dismiss();
  try {
    const record = (await postJson(servicePath(serviceId, action), body)).data;
    const what = { pause: "paused", resume: "resumed", skip: "resumed past its invalid batch",
      cancel: record.batch_ids.length + " batch(es) cancelled" }[action];
    say("service " + serviceId + ": " + what + " by " + record.actor +
      (record.detail === "already paused" ? " (already paused)" : ""), false);
  } catch (err) {
    say(action + " " + serviceId + " refused: " + err.message, true);
  }
  refresh();
}

function serviceState(s) {
  const p = s.ledger_problem;
  if (!p) return s.lock_reason || "–";
  return "ledger " + (p.kind === "submit" ? "refused a POST" : "status read failed") + ": " + p.cause +
    " (" + p.count + "×, first " + ago(p.since) + ")" + (s.lock_reason ? " · " + s.lock_reason : "");
}

function ledgerLine(name, health) {
  const bursts = health ? Object.entries(health.bursts) : [];
  if (!bursts.length) return "ledger: " + name;
  return "ledger: " + name + " · " + bursts.map(([kind, b]) =>
    (kind === "submit" ? "POSTs" : "status reads") + " failing: " + b.cause + " (" + b.count + "×, first " + ago(b.since) + ")"
  ).join(" · ") + " · " + health.services_affected + " services waiting";
}

function renderWorkers(doc) {
  const workers = (doc && doc.workers) || [];
  fill("workers", workers.map((w) => el("tr", {},
    el("td", { class: "num" }, String(w.index)),
    el("td", { class: "num" }, String(w.pid)),
    el("td", {}, w.role + (w.instance_id ? " (" + w.instance_id + ")" : "")),
    el("td", { class: "num" }, String(w.accepted)),
    el("td", { class: "num" }, String(w.restarts)))),
    "one process (serve --workers 1)", 5);
}

function renderInstances(doc) {
  renderWorkers(doc);
  if (!doc) {
    fill("instances", [], "single instance (no high-availability claims)", 4);
    return;
  }
  fill("instances", doc.data.map((i) => el("tr", {},
    el("td", { class: "id" }, i.instance_id),
    el("td", { class: "num" }, String(i.claims)),
    el("td", {}, ago(i.last_renewal)),
    el("td", {}, i.live ? "live" : "gone"))),
    doc.high_availability ? "no instances registered" : "single instance (no high-availability claims)", 4);
}

function renderBatches(batches) {
  fill("batches", batches.map((b) => el("tr", {},
    el("td", { class: "id", title: b.id }, short(b.id)),
    el("td", { class: "id" }, b.service_id),
    el("td", {}, el("span", { class: "status " + (b.status || "none") }, b.status || (b.submitted ? "submitting" : "queued"))),
    el("td", { class: "num" }, String(b.attempts ?? 0)),
    el("td", {}, ago(b.created_at)),
    el("td", { class: "error" }, b.error ? b.error.type + ": " + b.error.message : ""))),
    "no batches accepted by this gateway yet", 6);
}

async function refresh() {
  const conn = document.getElementById("conn");
  try {
    const [data, services, instances] = await Promise.all([
      getJson("/dashboard/data?recent=30&seconds=300"),
      getJson("/services?limit=1000"),
      getJson("/instances").catch(() => null),
    ]);
    // null for a token limited to some services: instance-wide figures are not theirs.
    document.getElementById("counts").hidden = data.counts === null;
    if (data.counts !== null) renderCounts(data.counts);
    if (data.throughput !== null) renderChart(data.throughput);
    renderServices(services.data);
    renderInstances(instances);
    renderBatches(data.recent);
    const ledger = document.getElementById("ledger");
    ledger.textContent = ledgerLine(data.ledger, data.ledger_health);
    ledger.className = data.ledger_health && Object.keys(data.ledger_health.bursts).length ? "error" : "muted";
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    conn.textContent = "live";
    conn.className = "pill ok";
    document.body.dataset.loaded = "true";
  } catch (err) {
    conn.textContent = "unreachable: " + err.message;
    conn.className = "pill bad";
  }
}

document.querySelector("#services tbody").addEventListener("click", (e) => {
  const button = e.target.closest("button[data-action]");
  if (button) ask(button.dataset.action, button.dataset.service);
});
document.getElementById("action-back").addEventListener("click", dismiss);
document.getElementById("action-confirm").addEventListener("click", confirmPending);
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && pending !== null) dismiss();
});

document.getElementById("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("ledgerq-token", document.getElementById("token").value);
  document.getElementById("token-box").hidden = true;
  refresh();
});

refresh();
setInterval(refresh, REFRESH_MS);
