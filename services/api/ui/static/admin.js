// Platform admin: teams (enable/disable), capacity and queues, the quota editor, keys, usage charts, audit.
"use strict";
(function () {
  const { api, el, replaceRows, when, size, poll, showError, lineChart } = window.TF;
  const $ = id => document.getElementById(id);
  const DAY = 86400;
  let teams = [];

  function fillTeamSelect(select) {
    const keep = select.value;
    select.replaceChildren(...teams.map(t => el("option", { value: t.name, text: t.name })));
    if (keep && teams.some(t => t.name === keep)) select.value = keep;
  }

  async function toggle(team, disabled) {
    showError($("teams-error"), null);
    try { await api("POST", `/v1/admin/teams/${encodeURIComponent(team)}/${disabled ? "enable" : "disable"}`); await refreshTeams(); }
    catch (e) { showError($("teams-error"), e); }
  }

  async function refreshTeams() {
    const [list, usage, cluster] = await Promise.all([api("GET", "/v1/admin/teams"), api("GET", "/v1/admin/usage"),
      api("GET", "/v1/admin/cluster")]);
    teams = list.teams;
    const byTeam = Object.fromEntries(usage.teams.map(u => [u.team, u]));
    const use = (u, k, f) => (u ? f(u.in_use[k] || 0) : "0") + " / " + (u && u.quota[k] !== null ? f(u.quota[k]) : "∞");
    replaceRows($("teams-body"), teams.map(t => {
      const u = byTeam[t.name];
      const button = el("button", { type: "button", text: t.disabled ? "Enable" : "Disable", "data-team": t.name });
      button.addEventListener("click", () => toggle(t.name, t.disabled));
      return el("tr", { "data-team": t.name },
        el("th", { scope: "row", text: t.name }), el("td", { text: t.disabled ? "disabled" : "enabled" }),
        el("td", { text: u ? u.active_jobs : 0 }), el("td", { text: u ? u.queued_jobs : 0 }),
        el("td", { text: use(u, "gpus", String) }), el("td", { text: use(u, "cpus", String) }),
        el("td", { text: use(u, "memory", size) }), el("td", { text: use(u, "jobs", String) }),
        el("td", {}, button));
    }));
    fillTeamSelect($("q-team"));
    fillTeamSelect($("k-team"));
    const sum = k => usage.teams.reduce((a, u) => a + (u.in_use[k] || 0), 0);
    $("cluster-totals").textContent = `Held now across teams: ${sum("gpus")} GPUs, ${sum("cpus")} CPUs, ` +
      `${size(sum("memory"))} memory, ${sum("jobs")} jobs; ` +
      `${usage.teams.reduce((a, u) => a + u.queued_jobs, 0)} jobs queued.`;
    const c = cluster.capacity, f = cluster.free;
    $("cluster-capacity").textContent = cluster.known
      ? `Capacity (${cluster.backend} backend): ${c.gpus} GPUs, ${c.cpus} CPUs, ${size(c.memory)} memory, ` +
        `${c.learners} learners; free now: ${f.gpus} GPUs, ${f.cpus} CPUs, ${size(f.memory)}, ${f.learners} learners.`
      : `Capacity not known: ${cluster.unknown_reason}`;
    // what the LCM's canary saw; empty on backends without one (local, docker)
    $("cluster-netpol").textContent = cluster.network_policy ? `NetworkPolicy: ${cluster.network_policy}` : "";
    const states = "deploying,running,storing,halting,restarting,queued";
    const lists = await Promise.all(teams.map(t =>
      api("GET", `/v1/admin/teams/${encodeURIComponent(t.name)}/jobs?limit=200&state=${states}`)));
    const jobs = lists.flatMap(l => l.jobs)
      .sort((a, b) => a.team.localeCompare(b.team) || (a.queue_position || 0) - (b.queue_position || 0));
    replaceRows($("cluster-jobs"), jobs.map(j => el("tr", { "data-job": j.id },
      el("td", { text: j.team }), el("td", { text: j.id }), el("td", { text: j.name }),
      el("td", {}, el("span", { className: "state st-" + j.state, text: j.state })),
      el("td", { text: j.queue_position || "" }), el("td", { text: j.reason }))));
  }

  // -- quota editor: the API validates; its messages name each bad field
  const num = v => (v.trim() === "" ? null : (isNaN(Number(v)) ? v.trim() : Number(v)));
  $("quota-form").addEventListener("submit", async e => {
    e.preventDefault();
    $("quota-errors").replaceChildren();
    $("quota-saved").textContent = "";
    const types = {};
    const bad = [];
    for (const part of $("q-types").value.split(",").map(s => s.trim()).filter(Boolean)) {
      const [t, n] = part.split("=").map(s => (s || "").trim());
      if (!t || n === undefined || !/^\d+$/.test(n)) bad.push(`gpus_by_type: ${part} is not TYPE=COUNT`);
      else types[t] = Number(n);
    }
    if (bad.length) { $("quota-errors").replaceChildren(...bad.map(m => el("li", { text: m }))); return; }
    const body = { gpus: num($("q-gpus").value), cpus: num($("q-cpus").value), memory: $("q-memory").value.trim() || null,
                   jobs: num($("q-jobs").value), gpus_by_type: types };
    try {
      const saved = await api("PUT", `/v1/admin/teams/${encodeURIComponent($("q-team").value)}/quota`, body);
      $("quota-saved").textContent = `Saved the quota of ${saved.team}.`;
      await refreshTeams();
    } catch (err) {
      const items = err.details && err.details.length ? err.details.map(d => `${d.field}: ${d.message}`) : [err.message];
      $("quota-errors").replaceChildren(...items.map(m => el("li", { text: m })));
    }
  });
  $("q-team").addEventListener("change", async () => {
    delete $("quota-form").dataset.loaded;
    const u = await api("GET", `/v1/admin/teams/${encodeURIComponent($("q-team").value)}/usage`);
    const v = x => (x === null || x === undefined ? "" : String(x));
    $("q-gpus").value = v(u.quota.gpus); $("q-cpus").value = v(u.quota.cpus);
    $("q-memory").value = u.quota.memory === null ? "" : String(u.quota.memory); $("q-jobs").value = v(u.quota.jobs);
    $("q-types").value = Object.entries(u.quota.gpus_by_type).map(([t, n]) => `${t}=${n}`).join(", ");
    $("quota-form").dataset.loaded = u.team;  // the fields now hold this team's quota
  });

  // -- keys
  async function refreshKeys() {
    const team = $("k-team").value;
    if (!team) return;
    const data = await api("GET", `/v1/admin/teams/${encodeURIComponent(team)}/keys`);
    replaceRows($("keys-body"), data.keys.map(k => {
      const revoke = el("button", { type: "button", className: "danger", text: "Revoke", disabled: k.revoked });
      revoke.addEventListener("click", async () => {
        try { await api("DELETE", `/v1/admin/keys/${encodeURIComponent(k.key_id)}`); await refreshKeys(); }
        catch (e) { showError($("key-error"), e); }
      });
      return el("tr", { "data-key": k.key_id }, el("td", { text: k.key_id }), el("td", { text: k.name }),
        el("td", { text: k.role }), el("td", { text: when(k.last_used_at) }),
        el("td", { text: k.revoked ? "revoked" : "active" }), el("td", {}, revoke));
    }));
  }
  $("k-team").addEventListener("change", refreshKeys);
  $("key-form").addEventListener("submit", async e => {
    e.preventDefault();
    showError($("key-error"), null);
    $("key-issued").hidden = true;
    try {
      const issued = await api("POST", `/v1/admin/teams/${encodeURIComponent($("k-team").value)}/keys`,
                               { name: $("k-name").value, role: $("k-role").value });
      $("key-value").textContent = issued.key;
      $("key-issued").hidden = false;
      await refreshKeys();
    } catch (err) {
      showError($("key-error"), err.details && err.details.length
        ? { message: err.details.map(d => `${d.field}: ${d.message}`).join("; ") } : err);
    }
  });

  // -- usage per team per day, last 14 days
  async function usageCharts() {
    const since = (Math.floor(Date.now() / 1000 / DAY) - 13) * DAY;
    $("usage-csv").setAttribute("href", "/v1/admin/usage.csv?since=" + since);
    const data = await api("GET", "/v1/admin/usage?since=" + since);
    const days = data.accounting.days;
    const names = [...new Set(days.map(d => d.team))].sort();
    const series = key => names.map(t => ({ name: t, points: [...Array(14).keys()].map(i => {
      const day = new Date((since + i * DAY) * 1000).toISOString().slice(0, 10);
      const row = days.find(d => d.team === t && d.day === day);
      return [i, row ? row[key] / 3600 : 0];
    }) }));
    $("usage-charts").replaceChildren(
      lineChart("GPU hours per day", series("gpu_seconds"), { xlabels: "x: days, oldest first" }),
      lineChart("GPU hours on borrowed quota per day", series("borrowed_gpu_seconds"),
        { xlabels: "x: days, oldest first" }),
      lineChart("CPU hours per day", series("cpu_seconds"), { xlabels: "x: days, oldest first" }),
      lineChart("CPU hours on borrowed quota per day", series("borrowed_cpu_seconds"),
        { xlabels: "x: days, oldest first" }),
      lineChart("Memory GiB-hours per day", series("memory_gib_seconds"), { xlabels: "x: days, oldest first" }));
  }

  // -- audit search
  async function audit() {
    const q = new URLSearchParams({ limit: "200" });
    if ($("a-team").value.trim()) q.set("team", $("a-team").value.trim());
    const data = await api("GET", "/v1/admin/audit?" + q.toString());
    const text = $("a-text").value.trim().toLowerCase();
    const hit = e => !text || [e.key_id, e.team, e.method, e.route, e.path, e.target, e.target_team, String(e.status)]
      .some(v => (v || "").toLowerCase().includes(text));
    replaceRows($("audit-body"), data.entries.filter(hit).map(e => el("tr", {},
      el("td", { text: when(e.ts) }), el("td", { text: e.key_id || "-" }), el("td", { text: e.team || "-" }),
      el("td", { text: e.method + " " + (e.path || e.route) }), el("td", { text: e.target || "" }),
      el("td", { text: e.status }))));
  }
  $("audit-form").addEventListener("submit", e => { e.preventDefault(); audit(); });

  (async () => {
    await refreshTeams();
    await refreshKeys();
    $("q-team").dispatchEvent(new Event("change"));
    usageCharts();
    audit();
  })();
  poll(refreshTeams, 3000, $("teams-error"));
})();
