// The team's quota against what it holds now, its running totals and its queue.
"use strict";
(function () {
  const { api, el, replaceRows, size, poll } = window.TF;
  const $ = id => document.getElementById(id);
  const lim = v => (v === null || v === undefined ? "no limit" : String(v));

  async function refresh() {
    const u = await api("GET", "/v1/team/usage");
    const rows = [
      ["GPUs", u.in_use.gpus, lim(u.quota.gpus)], ["CPUs", u.in_use.cpus, lim(u.quota.cpus)],
      ["Memory", size(u.in_use.memory || 0), u.quota.memory === null ? "no limit" : size(u.quota.memory)],
      ["Jobs", u.in_use.jobs, lim(u.quota.jobs)],
      ...Object.entries(u.quota.gpus_by_type).map(([t, n]) => ["GPUs " + t, u.in_use.gpus_by_type[t] || 0, String(n)]),
    ];
    replaceRows($("quota-body"), rows.map(([name, used, quota]) => el("tr", { "data-resource": name },
      el("th", { scope: "row", text: name }), el("td", { text: used ?? 0 }), el("td", { className: "quota", text: quota }))));
    $("team-totals").textContent = `${u.active_jobs} active, ${u.queued_jobs} queued; consumed ` +
      `${(u.gpu_seconds / 3600).toFixed(2)} GPU hours, ${(u.cpu_seconds / 3600).toFixed(2)} CPU hours`;
    const queued = await api("GET", "/v1/jobs?state=queued&limit=100");
    replaceRows($("queue-body"), queued.jobs.sort((a, b) => a.queue_position - b.queue_position).map(j => el("tr", {},
      el("td", { text: j.queue_position }),
      el("td", {}, el("a", { href: "/ui/jobs/" + encodeURIComponent(j.id), text: j.id })),
      el("td", { text: j.name }), el("td", { text: j.reason }))));
  }
  poll(refresh, 2000, null);
})();
