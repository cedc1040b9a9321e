// One job: state and history, learners, logs that follow, metrics charts, outputs and the actions.
"use strict";
(function () {
  const { api, el, replaceRows, when, poll, showError, lineChart } = window.TF;
  const jobId = document.getElementById("main").dataset.jobId;
  const base = "/v1/jobs/" + encodeURIComponent(jobId);
  const $ = id => document.getElementById(id);
  // which actions the API allows from which state (services/common/states.py)
  const CAN = {
    halt: new Set(["deploying", "running"]),
    resume: new Set(["halted"]),
    cancel: new Set(["pending", "queued", "deploying", "running", "storing", "halting", "halted", "restarting"]),
  };
  let job = null;

  function renderJob(j) {
    job = j;
    $("job-state").textContent = j.state;
    $("job-state").className = "state st-" + j.state;
    $("job-reason").textContent = j.reason || "";
    const b = j.borrowed;  // quota held beyond the team's own, borrowed in its cohort
    $("job-borrowed").hidden = !b && !j.preemptions;
    $("job-borrowed").textContent = [
      b ? `Borrowed from cohort ${b.cohort}: ` + [b.gpus ? `${b.gpus} GPUs` : "", b.cpus ? `${b.cpus} CPUs` : "",
        b.memory ? `${b.memory} bytes of memory` : ""].filter(Boolean).join(", ") + "." : "",
      j.preemptions ? `Preempted ${j.preemptions} time(s).` : ""].filter(Boolean).join(" ");
    for (const action of Object.keys(CAN)) $("btn-" + action).disabled = !CAN[action].has(j.state);
    replaceRows($("job-history"), j.history.map(h => el("li", {},
      el("time", { text: when(h.timestamp) }), " ",
      el("span", { className: "state st-" + h.to, text: h.to }), " ",
      el("span", { className: "reason", text: h.reason }), " ",
      el("span", { className: "actor", text: h.actor }))));
    replaceRows($("learners-body"), j.learners.map(l => el("tr", {},
      el("td", { text: l.rank }), el("td", { text: l.state }),
      el("td", { text: l.exit_code === null ? "" : l.exit_code }), el("td", { text: l.attempt }),
      el("td", { text: l.message }))));
  }

  async function act(action) {
    showError($("action-error"), null);
    try { renderJob(await api("POST", base + "/" + action)); }
    catch (e) { showError($("action-error"), e); }
  }
  for (const action of Object.keys(CAN)) $("btn-" + action).addEventListener("click", () => act(action));

  // logs: pages after the last cursor; a search asks the server (q) and stops following
  let cursor = null, lines = [], searching = "";
  const pre = $("log-lines");
  function appendLines(page) {
    for (const l of page.lines) {
      const row = el("span", { className: "line " + l.stream },
        el("span", { className: "meta", text: "[" + l.learner + "] " }), l.line + "\n");
      pre.append(row);
      lines.push(l);
    }
    $("log-count").textContent = lines.length + " lines" + (searching ? " matching" : "");
    if ($("log-follow").checked && page.lines.length) pre.scrollTop = pre.scrollHeight;
  }
  async function followLogs() {
    if (searching || !$("log-follow").checked) return;
    const q = new URLSearchParams({ limit: "1000" });
    if (cursor) q.set("after", cursor);
    const page = await api("GET", base + "/logs?" + q.toString());
    cursor = page.next;
    appendLines(page);
  }
  let searchTimer = null;
  $("log-search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(async () => {
      searching = $("log-search").value.trim();
      pre.replaceChildren(); lines = []; cursor = null;
      if (searching) {
        const page = await api("GET", base + "/logs?" + new URLSearchParams({ q: searching, limit: "1000" }));
        appendLines(page);
      } else {
        await followLogs();
      }
    }, 300);
  });

  async function metrics() {
    const data = await api("GET", base + "/metrics");
    const names = Object.keys(data.series || {});
    if (!names.length) return;
    const box = $("metrics-charts");
    box.replaceChildren(...names.slice(0, 8).map(n =>
      lineChart(n, [{ name: n, points: data.series[n].map(p => [p.step, p.value]) }], { xlabels: "x: step" })));
  }

  async function outputs() {
    const data = await api("GET", base + "/outputs");
    const files = data.learners.flatMap(l => l.files.map(f => [l.rank, f]));
    if (!files.length) return;
    replaceRows($("outputs-list"), files.map(([rank, f]) => el("li", {},
      el("a", { href: base + "/outputs/" + rank + "/" + f.path.split("/").map(encodeURIComponent).join("/"),
                text: rank + "/" + f.path }),
      " " + f.size + " bytes, sha256 " + f.sha256.slice(0, 12))));
  }

  poll(async () => renderJob(await api("GET", base)), 1000, $("action-error"));
  poll(followLogs, 1000, null);
  poll(async () => { if (job && !["pending", "queued"].includes(job.state)) { await metrics(); await outputs(); } },
       5000, null);
})();
