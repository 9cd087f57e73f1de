// Live updates for the run page and the runs list (see docs/dashboard.md).
//
// The socket only ever brings HTML fragments rendered by the server, each with a sequence number.
// A gap in the numbers, a number announced by the server's hello or heartbeat that differs from ours,
// or any reconnect: the live part of the page is fetched again from the database. Nothing is sent
// through the socket; actions are ordinary forms.
(function () {
  "use strict";
  const root = document.querySelector("[data-live]");
  if (!root || !window.WebSocket) return;
  const status = document.getElementById("live-status");
  const isRun = Boolean(root.dataset.run);
  const openKey = isRun ? "warden:open:" + root.dataset.run : null;
  let seq = 0;
  let seqs = {};
  let delay = 500;
  let opened = false;
  let refetching = false;
  let buffer = [];

  function show(text, state) {
    if (!status) return;
    status.textContent = text;
    status.dataset.state = state;
  }

  function readSeqs() {
    if (isRun) {
      const live = document.getElementById("run-live");
      seq = live ? Number(live.dataset.seq) : 0;
    } else {
      const rows = document.getElementById(root.dataset.target);
      seqs = rows && rows.dataset.seqs ? JSON.parse(rows.dataset.seqs) : {};
    }
  }

  // --- collapse state of the trace tree, per run, kept in this browser ---
  function openState() {
    try {
      return JSON.parse(localStorage.getItem(openKey) || "{}");
    } catch (e) {
      return {};
    }
  }
  function restoreOpen(scope) {
    if (!openKey) return;
    const state = openState();
    const nodes = scope.matches && scope.matches("details") ? [scope] : [];
    scope.querySelectorAll("details[id]").forEach((d) => nodes.push(d));
    nodes.forEach((d) => {
      if (d.id in state && d.open !== state[d.id]) d.open = state[d.id];
    });
  }
  document.addEventListener(
    "toggle",
    (event) => {
      const d = event.target;
      if (!openKey || !(d instanceof HTMLDetailsElement) || !d.id) return;
      const state = openState();
      state[d.id] = d.open;
      localStorage.setItem(openKey, JSON.stringify(state));
    },
    true
  );

  // --- applying fragments: replace by id, or append to the container named by data-parent ---
  function apply(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    Array.from(template.content.children).forEach((el) => {
      if (!el.id) return;
      const existing = document.getElementById(el.id);
      if (existing && el.classList.contains("node")) {
        // A tree node already drawn keeps its children and its open state: only its line changes.
        const row = el.querySelector(":scope > details > summary");
        const old = existing.querySelector(":scope > details > summary");
        if (row && old) old.replaceWith(row);
        existing.className = el.className;
      } else if (existing) {
        existing.replaceWith(el);
        htmx.process(el);
        restoreOpen(el);
      } else if (el.dataset.parent && (isRun || root.dataset.acceptNew !== undefined)) {
        // A new row joins the list only where it certainly belongs: the newest runs, unfiltered.
        const parent = document.getElementById(el.dataset.parent);
        if (!parent) return; // inside a subtree not loaded yet: it will come from the database
        const empty = parent.querySelector(":scope > .empty");
        if (empty) empty.remove();
        if (el.dataset.prepend !== undefined) parent.prepend(el);
        else parent.append(el);
        htmx.process(el);
        restoreOpen(el);
      }
    });
  }

  function refetch() {
    if (refetching) return;
    refetching = true;
    show("catching up…", "catching-up");
    const target = "#" + root.dataset.target;
    htmx
      .ajax("GET", root.dataset.refresh, { target: target, swap: "outerHTML" })
      .then(() => {
        readSeqs();
        restoreOpen(document.querySelector(target) || document);
        refetching = false;
        const waiting = buffer;
        buffer = [];
        show("live", "live");
        waiting.forEach(handle);
      })
      .catch(() => {
        refetching = false;
        setTimeout(refetch, 2000);
      });
  }

  function handle(m) {
    if (refetching) {
      buffer.push(m);
      return;
    }
    if (isRun) {
      if (m.hello || m.beat) {
        if (m.seq !== seq) refetch();
        return;
      }
      if (m.seq <= seq) return; // already seen, or older than what the page shows
      if (m.refetch || m.seq !== seq + 1) {
        refetch();
        return;
      }
      seq = m.seq;
      apply(m.html);
      if (m.timeline) {
        const timeline = document.getElementById("timeline");
        if (timeline) htmx.trigger(timeline, "refresh");
      }
      return;
    }
    if (m.hello || m.beat) {
      const differs = Object.keys(m.seqs).some((p) => (seqs[p] || 0) !== m.seqs[p]);
      if (differs) refetch();
      return;
    }
    const project = String(m.project);
    const mine = seqs[project] || 0;
    if (m.seq <= mine) return;
    if (m.seq !== mine + 1) {
      refetch();
      return;
    }
    seqs[project] = m.seq;
    apply(m.html);
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + root.dataset.live);
    socket.onopen = () => {
      delay = 500;
      show("live", "live");
      if (opened) refetch(); // whatever happened while we were away
      opened = true;
    };
    socket.onmessage = (event) => handle(JSON.parse(event.data));
    socket.onclose = (event) => {
      if (event.code === 4403) {
        show("live updates stopped: you may no longer see this", "denied");
        return;
      }
      // Any other close, whatever its code (a deploy sends 1001), is followed by a reconnect.
      show("reconnecting…", "reconnecting");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }

  document.addEventListener("htmx:afterSwap", (event) => restoreOpen(event.detail.target));
  readSeqs();
  restoreOpen(document);
  show("connecting…", "connecting");
  connect();
})();
