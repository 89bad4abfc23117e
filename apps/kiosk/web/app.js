// The kiosk dashboard: renders the snapshots /events sends. Loads nothing from any other host; text from the
// kiosk (reasons, frame ids) only ever goes in through textContent.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const show = (id, value) => { $(id).textContent = value; };
  const num = (v, digits = 1) => (v === null || v === undefined ? "—" : Number(v).toFixed(digits));
  const pct = (v) => (v === null || v === undefined ? "—" : `${Number(v).toFixed(1)} %`);
  const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  const NS = $("chart-parts").namespaceURI; // the SVG namespace, taken from the page rather than spelled out
  const gallery = new Map(); // reject number -> its element, so pictures load once
  const frame = { shown: null, wanted: null, loading: false };

  function describe(obj, skip = []) {
    return Object.entries(obj || {})
      .filter(([k, v]) => !skip.includes(k) && v !== null && typeof v !== "object")
      .slice(0, 4)
      .map(([k, v]) => `${k.replace(/_/g, " ")} ${typeof v === "number" ? +v.toFixed(2) : v}`)
      .join(" · ");
  }

  function setState(id, state, text) {
    $(id).dataset.state = state;
    show(id, text);
  }

  function renderLinks(s) {
    show("model", s.model.name ? `${s.model.name}${s.model.version ? " " + s.model.version : ""}` : "—");
    const plc = s.plc;
    if (!plc) setState("plc", "none", "no PLC");
    else {
      const extra = [];
      if (plc.backlog !== undefined) extra.push(`backlog ${plc.backlog}`);
      if (plc.last_acked_part !== undefined && plc.last_acked_part !== null) extra.push(`last ack #${plc.last_acked_part}`);
      if (plc.waiting_s > 0) extra.push(`oldest waiting ${num(plc.waiting_s)} s`);
      const up = plc.connected === true;
      setState("plc", up ? "ok" : "down", [up ? "connected" : "disconnected", ...extra].join(" · "));
    }
    const src = s.source;
    if (!src) setState("source", "none", "—");
    else {
      // a source's health(): state "running" when frames come; a camera "reconnecting" while its watchdog reopens it
      const parts = [src.state ?? "?"];
      if (src.restarts) parts.push(`restarts ${src.restarts}`);
      if (src.errors) parts.push(`errors ${src.errors}`);
      if (src.last_frame_age_s > 1) parts.push(`last frame ${num(src.last_frame_age_s)} s ago`);
      setState("source", src.state === "running" ? "ok" : "down", parts.join(" · "));
    }
    show("temperature", s.temperature_c === null ? "no sensor" : `${num(s.temperature_c)} °C`);
    setState("saturation", s.saturated ? "saturated" : "ok", s.saturated ? "SATURATED" : "not saturated");
  }

  function renderCounts(s) {
    const c = s.counts, r = s.rates;
    show("parts", c.parts);
    show("rate", num(r.parts_per_s));
    for (const v of ["pass", "reject", "review"]) {
      show(`${v}-count`, c[v]);
      show(`${v}-pct`, pct(r[`${v}_pct`]));
    }
    show("p50", num(s.latency_ms.p50));
    show("p99", num(s.latency_ms.p99));
    show("lat-n", s.latency_ms.n);
    const rows = Object.entries(s.latency_ms.stages).map(([stage, q]) => {
      const tr = document.createElement("tr");
      for (const cell of [stage, num(q.p50), num(q.p99)]) {
        const td = document.createElement("td");
        td.textContent = cell;
        tr.append(td);
      }
      return tr;
    });
    $("stages").replaceChildren(...rows);
    show("failsafe-count", c.failsafe);
    const reasons = Object.entries(s.failsafe_reasons).map(([k, n]) => `${k} ${n}`).join(" · ");
    show("failsafe-reasons", reasons || "none");
    show("saturated-count", c.saturated);
    const p = s.pipeline;
    show("pipeline", !p ? "—" : p.queued !== undefined
      ? [`queue ${p.queued}/${p.max_queue ?? "?"}`, p.late ? `late ${p.late}` : ""].filter(Boolean).join(" · ")
      : describe(p) || "—");
  }

  function loadFrame() {
    if (frame.loading || frame.wanted === frame.shown) return;
    frame.loading = true;
    const seq = frame.wanted;
    const img = $("frame");
    img.onload = img.onerror = () => {
      frame.loading = false;
      frame.shown = seq;
      loadFrame(); // a newer part was decided meanwhile
    };
    img.src = `/api/frame/latest?seq=${seq}`;
  }

  function renderLive(last) {
    if (!last) return;
    const v = $("verdict");
    v.dataset.verdict = last.verdict;
    v.textContent = last.failsafe ? `${last.verdict} (fail-safe)` : last.verdict;
    show("part", `part #${last.seq} · ${last.frame_id}`);
    show("reason", `${last.reason} · score ${num(last.score, 3)} · confidence ${num(last.confidence, 2)}`);
    if (last.image) {
      frame.wanted = last.seq;
      loadFrame();
    }
  }

  function svg(tag, attrs, text) {
    const el = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    return el;
  }

  const W = 600, H = 160, LEFT = 34, BOTTOM = 16, TOP = 6, MIN_SLOTS = 30; // a young history does not stretch

  function axes(el, buckets, top) {
    el.append(svg("text", { x: 2, y: TOP + 10 }, num(top, top < 10 ? 1 : 0)), svg("text", { x: 2, y: H - BOTTOM }, "0"));
    if (!buckets.length) return;
    const slots = Math.max(buckets.length, MIN_SLOTS);
    const firstX = LEFT + ((slots - buckets.length) * (W - LEFT)) / slots;
    if (firstX < W - 120) el.append(svg("text", { x: firstX, y: H - 3 }, clock(buckets[0].t))); // room for both
    el.append(svg("text", { x: W - 2, y: H - 3, "text-anchor": "end" }, clock(buckets[buckets.length - 1].t)));
  }

  function partsChart(buckets) {
    const el = $("chart-parts");
    el.replaceChildren();
    const top = Math.max(1, ...buckets.map((b) => b.parts));
    const slots = Math.max(buckets.length, MIN_SLOTS), step = (W - LEFT) / slots;
    const first = slots - buckets.length; // newest at the right edge
    const scale = (H - BOTTOM - TOP) / top;
    buckets.forEach((b, j) => {
      const i = first + j;
      let y = H - BOTTOM;
      for (const v of ["pass", "review", "reject"]) {
        const h = b[v] * scale;
        if (h <= 0) continue;
        y -= h;
        const bar = svg("rect", { x: LEFT + i * step + 1, y, width: Math.max(step - 2, 1), height: h, class: `bar-${v}` });
        bar.append(svg("title", {}, `${clock(b.t)}: ${b[v]} ${v}`));
        el.append(bar);
      }
    });
    axes(el, buckets, top);
  }

  function latencyChart(buckets) {
    const el = $("chart-latency");
    el.replaceChildren();
    const top = Math.max(1, ...buckets.map((b) => b.p99 || 0));
    const slots = Math.max(buckets.length, MIN_SLOTS), step = (W - LEFT) / slots;
    const first = slots - buckets.length;
    for (const q of ["p50", "p99"]) {
      let d = "", pen = "M";
      buckets.forEach((b, j) => {
        if (b[q] === null) { pen = "M"; return; }
        const x = (LEFT + (first + j + 0.5) * step).toFixed(1);
        const y = (H - BOTTOM - (b[q] / top) * (H - BOTTOM - TOP)).toFixed(1);
        d += `${pen}${x},${y} `;
        pen = "L";
        const dot = svg("circle", { cx: x, cy: y, r: 2.5, class: `dot-${q}` }); // a lone bucket is still seen
        dot.append(svg("title", {}, `${clock(b.t)}: ${q} ${num(b[q])} ms`));
        el.append(dot);
      });
      if (d) el.append(svg("path", { d, class: `line-${q}` }));
    }
    axes(el, buckets, top);
  }

  function galleryItem(item) {
    const fig = document.createElement("figure");
    fig.className = "reject-item";
    fig.dataset.n = item.n;
    fig.dataset.seq = item.seq;
    if (item.image) {
      const img = document.createElement("img");
      img.src = `/api/rejects/${item.n}`;
      img.alt = `reject, part #${item.seq}`;
      fig.append(img);
    } else {
      const none = document.createElement("div");
      none.className = "noimage";
      none.textContent = "no frame";
      fig.append(none);
    }
    const cap = document.createElement("figcaption");
    if (item.heatmap) {
      const tag = document.createElement("span");
      tag.className = "tag";
      tag.textContent = "heat map";
      cap.append(tag);
    }
    cap.append(`#${item.seq} · ${item.failsafe ? "fail-safe: " : ""}${item.reason} · score ${num(item.score, 3)}`);
    fig.append(cap);
    return fig;
  }

  function renderGallery(items) {
    const keep = new Set(items.map((i) => i.n));
    for (const n of gallery.keys()) if (!keep.has(n)) gallery.delete(n);
    const nodes = items.map((item) => {
      if (!gallery.has(item.n)) gallery.set(item.n, galleryItem(item));
      return gallery.get(item.n);
    });
    if (nodes.length) $("gallery").replaceChildren(...nodes);
    show("gallery-count", nodes.length ? `(last ${nodes.length})` : "");
  }

  const bytes = (n) => (n === null || n === undefined ? "—" : n >= 1 << 30 ? `${num(n / 2 ** 30)} GiB`
    : `${num(n / 2 ** 20)} MiB`);

  function renderAudit(a) {
    if (!a) { setState("audit", "none", "—"); return; }
    const pruned = Object.values(a.pruned || {}).reduce((x, y) => x + y, 0);
    const parts = [`rows ${a.rows}`, `pruned ${pruned}`, `free ${bytes(a.free_bytes)}`];
    if (a.low_space) parts.push("LOW SPACE");
    setState("audit", a.low_space || a.last_error ? "down" : "ok", parts.join(" · "));
    $("audit").title = Object.entries(a.pruned || {}).map(([k, n]) => `${k.replace(/_/g, " ")}: ${n}`).join("\n");
  }

  function renderFaults(f) {
    const box = $("faults");
    box.hidden = !f || !f.latched;
    if (box.hidden) return;
    show("fault-effect", f.rejecting ? "every part is REJECTED until an operator clears it" : "parts are still decided");
    $("fault-list").replaceChildren(...f.active.map((x) => {
      const li = document.createElement("li");
      li.textContent = `${x.kind}: ${x.message} (since ${clock(x.since)}, ${x.count} failure${x.count === 1 ? "" : "s"})`;
      return li;
    }));
  }

  async function clearFaults() {
    const operator = $("fault-operator").value.trim();
    if (!operator) { show("fault-result", "give the operator's name first"); return; }
    try {
      const r = await fetch("/api/faults/clear", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ operator, note: $("fault-note").value.trim() }),
      });
      const text = await r.text();
      show("fault-result", r.ok ? `cleared ${JSON.parse(text).cleared.length}` : text.trim());
    } catch (e) {
      show("fault-result", `not cleared: ${e}`);
    }
  }
  $("fault-clear").addEventListener("click", clearFaults);

  function render(s) {
    renderFaults(s.faults);
    renderAudit(s.audit);
    renderLinks(s);
    renderCounts(s);
    renderLive(s.last);
    partsChart(s.history.buckets);
    latencyChart(s.history.buckets);
    show("bucket", `(${num(s.history.bucket_s, 0)} s buckets)`);
    renderGallery(s.gallery);
    document.body.dataset.version = s.version;
  }

  function connect() {
    const events = new EventSource("/events");
    events.onopen = () => setState("link", "live", "live");
    events.onmessage = (e) => render(JSON.parse(e.data));
    events.onerror = () => {
      setState("link", "connecting", "reconnecting…");
      if (events.readyState === EventSource.CLOSED) setTimeout(connect, 3000); // refused: try again later
    };
  }

  connect();
})();
