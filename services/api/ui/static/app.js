// trainforge dashboard: shared helpers. Data only ever reaches the page through textContent
// and attributes set one by one, never through innerHTML, so nothing a job prints can run.
"use strict";
(function () {
  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  class ApiError extends Error {
    constructor(status, body) {
      const err = (body && body.error) || {};
      super(err.message || ("HTTP " + status));
      this.status = status;
      this.details = err.details || [];
    }
  }

  async function api(method, path, body) {
    const opts = { method, credentials: "same-origin", headers: { "Accept": "application/json" } };
    if (method !== "GET") opts.headers["X-CSRF-Token"] = csrf();
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const resp = await fetch(path, opts);
    if (resp.status === 401) {
      window.location.assign("/ui/login");  // the session ended (expired, key revoked, team disabled)
      throw new ApiError(401, null);
    }
    const data = await resp.json().catch(() => null);
    if (!resp.ok) throw new ApiError(resp.status, data);
    return data;
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = String(v);
      else if (k === "className") node.className = v;
      else node.setAttribute(k, String(v));
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }

  function replaceRows(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function when(ts) {
    if (!ts) return "-";
    return new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
  }

  function age(ts) {
    const s = Math.max(0, Date.now() / 1000 - ts);
    if (s < 60) return Math.floor(s) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 86400) return Math.floor(s / 3600) + "h";
    return Math.floor(s / 86400) + "d";
  }

  function size(n) {
    if (n === null || n === undefined) return "∞";
    const units = [["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["Ki", 2 ** 10]];
    for (const [u, f] of units) if (n >= f) return (n / f).toFixed(n % f ? 1 : 0) + u;
    return String(n);
  }

  function showError(node, err) {
    node.hidden = !err;
    node.textContent = err ? (err.message || String(err)) : "";
  }

  // Polls fn every `ms` while the page is open; a failed poll is shown, the next one tries again.
  function poll(fn, ms, errorNode) {
    let stopped = false;
    async function tick() {
      if (stopped) return;
      try { await fn(); if (errorNode) showError(errorNode, null); }
      catch (e) { if (errorNode) showError(errorNode, e); }
      setTimeout(tick, ms);
    }
    tick();
    return () => { stopped = true; };
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }

  // A small line chart of [[x, y], ...] series, drawn with our own SVG (no chart library to ship).
  function lineChart(title, series, opts) {
    const W = 420, H = 180, P = 36;
    const all = series.flatMap(s => s.points);
    const box = el("figure", { className: "chart" });
    box.append(el("figcaption", { text: title }));
    if (!all.length) { box.append(el("p", { className: "hint", text: "no data" })); return box; }
    const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys);
    const sx = x => P + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - 2 * P);
    const sy = y => H - P + (y1 === y0 ? -0.5 : -(y - y0) / (y1 - y0)) * (H - 2 * P);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", width: W, height: H });
    const label = svg("title"); label.textContent = title; root.append(label);
    root.append(svg("line", { x1: P, y1: H - P, x2: W - P, y2: H - P, class: "axis" }));
    root.append(svg("line", { x1: P, y1: P, x2: P, y2: H - P, class: "axis" }));
    for (const [v, y] of [[y1, sy(y1)], [y0, sy(y0)]]) {
      const t = svg("text", { x: 2, y: y + 4, class: "tick" }); t.textContent = fmt(v); root.append(t);
    }
    series.forEach((s, i) => {
      const d = s.points.map((p, j) => (j ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
      root.append(svg("path", { d, class: "series s" + (i % 6), fill: "none" }));
    });
    box.append(root);
    const legend = el("ul", { className: "legend" });
    series.forEach((s, i) => legend.append(el("li", { className: "s" + (i % 6), text: s.name })));
    box.append(legend);
    if (opts && opts.xlabels) box.append(el("p", { className: "hint", text: opts.xlabels }));
    return box;
  }

  function fmt(v) {
    return Math.abs(v) >= 1000 ? v.toExponential(2) : (Math.round(v * 1000) / 1000).toString();
  }

  window.TF = { api, el, replaceRows, when, age, size, showError, poll, lineChart, ApiError };
})();
