// The AppBridge call console (docs/web.md): the live and recently ended calls, and for the
// chosen one its timeline of messages between the gateway and the app, turn events, audio
// counters and levels. Everything shown is set as text, never parsed as HTML.
"use strict";

(() => {
  const CALLS_MS = 1000; // the call lists
  const TIMELINE_MS = 500; // the chosen call's timeline, while it is live
  const MAX_ENTRIES = 2000; // as many as the gateway keeps per call

  const el = (id) => document.getElementById(id);
  const ui = {
    live: el("live"),
    ended: el("ended"),
    chosen: el("chosen"),
    hangup: el("hangup"),
    showLevels: el("show-levels"),
    status: el("console-status"),
    levelIn: el("level-in"),
    levelOut: el("level-out"),
    timeline: el("timeline"),
    dropped: document.querySelector(".dropped"),
  };

  let chosen = null; // {ref, after, live, timer}
  let lastLists = { live: [], ended: [] };

  const { api, showLevel, SILENT_DBFS } = window.AppBridge;

  function duration(ms) {
    const total = Math.max(0, Math.floor(Number(ms) / 1000) || 0);
    const m = Math.floor(total / 60);
    const s = String(total % 60).padStart(2, "0");
    return `${m}:${s}`;
  }

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text === undefined || text === null ? "" : String(text);
    return td;
  }

  function renderTable(table, calls, lastColumn) {
    const body = table.tBodies[0];
    const rows = calls.map((call) => {
      const tr = document.createElement("tr");
      tr.dataset.callRef = String(call.callRef);
      tr.tabIndex = 0;
      tr.append(
        cell(call.callRef),
        cell(call.app),
        cell(call.carrier),
        cell(call.from),
        cell(call.to),
        cell(call[lastColumn]),
        cell(duration(call.durationMs)),
      );
      if (chosen && chosen.ref === tr.dataset.callRef) tr.classList.add("selected");
      return tr;
    });
    body.replaceChildren(...rows);
    const empty = document.querySelector(`.empty[data-for="${table.id}"]`);
    if (empty) empty.hidden = rows.length > 0;
  }

  async function refreshCalls() {
    try {
      const res = await api("/v1/console/calls");
      if (res.ok) {
        const body = await res.json();
        lastLists = { live: body.live || [], ended: body.ended || [] };
        renderTable(ui.live, lastLists.live, "state");
        renderTable(ui.ended, lastLists.ended, "reason");
        ui.status.textContent = "";
        if (chosen) noteLiveness();
      } else {
        ui.status.textContent = `calls: HTTP ${res.status}`;
      }
    } catch (err) {
      ui.status.textContent = `calls: ${err.message}`;
    }
    setTimeout(refreshCalls, CALLS_MS);
  }

  function noteLiveness() {
    const live = lastLists.live.some((c) => String(c.callRef) === chosen.ref);
    ui.hangup.disabled = !live;
  }

  // ------------------------------------------------------------------ the chosen call

  function choose(ref) {
    if (chosen && chosen.ref === ref) return;
    if (chosen) clearTimeout(chosen.timer);
    chosen = { ref, after: null, live: true, timer: 0 };
    ui.chosen.textContent = ref;
    ui.timeline.replaceChildren();
    ui.dropped.hidden = true;
    showLevel(ui.levelIn, SILENT_DBFS);
    showLevel(ui.levelOut, SILENT_DBFS);
    for (const tr of document.querySelectorAll("tr[data-call-ref]")) {
      tr.classList.toggle("selected", tr.dataset.callRef === ref);
    }
    noteLiveness();
    pollTimeline(chosen);
  }

  function span(className, text) {
    const s = document.createElement("span");
    s.className = className;
    s.textContent = text === undefined || text === null ? "" : String(text);
    return s;
  }

  function entryItem(entry) {
    const li = document.createElement("li");
    li.dataset.kind = String(entry.kind);
    li.dataset.type = String(entry.type);
    li.dataset.seq = String(entry.seq);
    if (entry.dir) li.dataset.dir = String(entry.dir);
    const at = `${(Number(entry.ms) / 1000).toFixed(2)} s`;
    li.append(
      span("at", at),
      span("dir", entry.dir || ""),
      span("kind", entry.kind),
      span("type", entry.type),
      span("summary", entry.summary),
    );
    if (entry.data && entry.kind === "message") li.title = JSON.stringify(entry.data, null, 1);
    return li;
  }

  function appendEntries(call, body) {
    let level = null;
    const items = [];
    for (const entry of body.entries || []) {
      if (entry.kind === "level") level = entry;
      items.push(entryItem(entry));
    }
    if (items.length) {
      const atBottom = ui.timeline.scrollHeight - ui.timeline.scrollTop - ui.timeline.clientHeight < 40;
      ui.timeline.append(...items);
      while (ui.timeline.childElementCount > MAX_ENTRIES) ui.timeline.firstElementChild.remove();
      if (atBottom) ui.timeline.scrollTop = ui.timeline.scrollHeight;
    }
    if (level && level.data) {
      showLevel(ui.levelIn, level.data.in_dbfs);
      showLevel(ui.levelOut, level.data.out_dbfs);
    }
    if (body.dropped) {
      ui.dropped.hidden = false;
      ui.dropped.textContent = `${body.dropped} older entries were dropped by the gateway.`;
    }
  }

  async function pollTimeline(call) {
    if (chosen !== call) return;
    try {
      const query = call.after === null ? "" : `?after=${encodeURIComponent(call.after)}`;
      const res = await api(`/v1/console/calls/${encodeURIComponent(call.ref)}/timeline${query}`);
      if (chosen !== call) return;
      if (res.status === 404) {
        ui.status.textContent = "this call is no longer known to the gateway";
        return;
      }
      if (res.ok) {
        const body = await res.json();
        if (chosen !== call) return;
        appendEntries(call, body);
        if (body.next !== undefined && body.next !== null) call.after = body.next;
        call.live = Boolean(body.live);
        if (!call.live) {
          // An ended call's timeline is complete: no more polling, and the meters rest.
          ui.hangup.disabled = true;
          showLevel(ui.levelIn, SILENT_DBFS);
          showLevel(ui.levelOut, SILENT_DBFS);
          return;
        }
      }
    } catch (_) {
      // retried on the next tick
    }
    if (chosen === call) call.timer = setTimeout(() => pollTimeline(call), TIMELINE_MS);
  }

  async function hangUp() {
    if (!chosen) return;
    const ref = chosen.ref;
    ui.hangup.disabled = true;
    try {
      const res = await api(`/v1/console/calls/${encodeURIComponent(ref)}/hangup`, { method: "POST" });
      ui.status.textContent = res.ok ? `hung up ${ref}` : `hang-up: HTTP ${res.status}`;
    } catch (err) {
      ui.status.textContent = `hang-up: ${err.message}`;
    }
  }

  // ------------------------------------------------------------------ wiring

  function onRowEvent(event) {
    if (event.type === "keydown" && event.key !== "Enter" && event.key !== " ") return;
    const tr = event.target.closest("tr[data-call-ref]");
    if (tr) {
      event.preventDefault();
      choose(tr.dataset.callRef);
    }
  }

  for (const table of [ui.live, ui.ended]) {
    table.addEventListener("click", onRowEvent);
    table.addEventListener("keydown", onRowEvent);
  }
  ui.hangup.addEventListener("click", hangUp);
  ui.showLevels.addEventListener("change", () => {
    document.body.classList.toggle("show-levels", ui.showLevels.checked);
  });

  refreshCalls();
})();
