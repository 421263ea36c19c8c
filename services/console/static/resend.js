// The resend job page: poll the job's progress JSON until it is finished and update the
// status in place (the page works without this: its Refresh link reloads it).
"use strict";
(function () {
  const root = document.getElementById("resend-job");
  if (!root) return;
  const url = root.dataset.progressUrl;
  const bar = document.getElementById("resend-bar");
  const POLL_MS = 500;
  const MAX_POLLS = 7200; // an hour at most, then the Refresh link is left
  let polls = 0;

  function set(name, value) {
    const node = root.querySelector('[data-field="' + name + '"]');
    if (node) node.textContent = String(value);
  }

  function show(job) {
    set("state", job.finished ? "Done" : "Running");
    for (const name of ["handled", "total", "done", "skipped", "failed"]) set(name, job[name]);
    bar.max = Math.max(job.total, 1);
    bar.value = job.handled;
    const list = root.querySelector('[data-field="errors"]');
    list.replaceChildren(...job.errors.map(function (text) {
      const item = document.createElement("li");
      item.textContent = text;
      return item;
    }));
  }

  async function poll() {
    polls += 1;
    try {
      const reply = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (!reply.ok) return;
      const job = await reply.json();
      show(job);
      if (job.finished) return;
    } catch (error) {
      // A lost poll: the next one tries again.
    }
    if (polls < MAX_POLLS) setTimeout(poll, POLL_MS);
  }

  poll();
})();
