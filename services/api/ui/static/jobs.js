// The team's jobs, polled from GET /v1/jobs with the filters on the page.
"use strict";
(function () {
  const { api, el, replaceRows, age, poll } = window.TF;
  const body = document.getElementById("jobs-body");
  const state = document.getElementById("f-state");
  const name = document.getElementById("f-name");
  const updated = document.getElementById("jobs-updated");
  // an elastic job's manifest says {min, max}
  const learnerCount = n => (n && typeof n === "object") ? `${n.min}-${n.max}` : String(n || 1);

  async function refresh() {
    const q = new URLSearchParams({ limit: "100" });
    if (state.value) q.set("state", state.value);
    if (name.value.trim()) q.set("name", name.value.trim());
    const data = await api("GET", "/v1/jobs?" + q.toString());
    replaceRows(body, data.jobs.map(j => el("tr", { "data-job": j.id },
      el("td", {}, el("a", { href: "/ui/jobs/" + encodeURIComponent(j.id), text: j.id })),
      el("td", { text: j.name }),
      el("td", {}, el("span", { className: "state st-" + j.state, text: j.state })),
      el("td", { text: j.reason }),
      el("td", { text: j.queue_position ? String(j.queue_position) : "" }),
      el("td", { text: j.learners.length ? j.learners.map(l => l.state).join(", ") : learnerCount(j.manifest.learners) }),
      el("td", { text: age(j.created_at), title: new Date(j.created_at * 1000).toISOString() }),
      el("td", { text: j.submitted_by }))));
    updated.textContent = data.jobs.length + " jobs";
  }

  document.getElementById("filters").addEventListener("submit", e => { e.preventDefault(); refresh(); });
  state.addEventListener("change", refresh);
  name.addEventListener("input", refresh);
  poll(refresh, 1500, document.getElementById("jobs-error"));
})();
