// Live charts: poll the console's snapshot of the services' metric totals, keep a bounded
// ring of samples here in the browser (the console keeps none), and draw per-second
// rates and mean latencies between consecutive snapshots as inline SVG polylines.
"use strict";
(function () {
  const root = document.getElementById("charts");
  if (!root) return;
  const SVG = "http://www.w3.org/2000/svg";
  const url = root.dataset.url;
  const pollMs = Number(root.dataset.pollMs);
  const ring = Number(root.dataset.ring);
  const WIDTH = 600, HEIGHT = 160, PAD = 4, LINE_CLASSES = 6;
  // series key -> endpoint name -> [{t, v}] (at most `ring` points each)
  const points = {};
  let previous = null;

  function push(key, name, t, v) {
    const byName = points[key] || (points[key] = {});
    const list = byName[name] || (byName[name] = []);
    list.push({ t: t, v: v });
    if (list.length > ring) list.shift();
  }

  function sample(snap) {
    if (previous !== null) {
      const seconds = (snap.time_ms - previous.time_ms) / 1000;
      const before = {};
      for (const e of previous.endpoints) before[e.name] = e;
      for (const e of snap.endpoints) {
        const old = before[e.name];
        if (e.error || !old || old.error || seconds <= 0) continue;
        for (const key in e.counters) {
          const delta = e.counters[key] - (old.counters[key] || 0);
          if (delta >= 0 && key in old.counters) push(key, e.name, snap.time_ms, delta / seconds);
        }
        for (const key in e.latencies) {
          const was = old.latencies[key];
          if (!was) continue;
          const count = e.latencies[key][1] - was[1];
          const sum = e.latencies[key][0] - was[0];
          // A mean over the calls of the interval, in ms; none without calls.
          if (count > 0 && sum >= 0) push(key, e.name, snap.time_ms, (1000 * sum) / count);
        }
      }
    }
    previous = snap;
  }

  function draw(figure, key) {
    const svg = figure.querySelector("svg");
    const byName = points[key] || {};
    const names = Object.keys(byName).sort();
    let max = 0, first = Infinity, last = -Infinity;
    for (const name of names) {
      for (const p of byName[name]) {
        max = Math.max(max, p.v);
        first = Math.min(first, p.t);
        last = Math.max(last, p.t);
      }
    }
    svg.replaceChildren();
    if (!names.length) {
      figure.querySelector('[data-field="last"]').textContent =
        "(no configured endpoint reports this metric yet)";
      return;
    }
    const span = Math.max(last - first, 1);
    const top = max > 0 ? max * 1.1 : 1;
    const x = (t) => PAD + ((WIDTH - 2 * PAD) * (t - first)) / span;
    const y = (v) => HEIGHT - PAD - ((HEIGHT - 2 * PAD) * v) / top;
    names.forEach(function (name, index) {
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("class", "line line-" + (index % LINE_CLASSES));
      line.setAttribute("points", byName[name].map((p) => x(p.t) + "," + y(p.v)).join(" "));
      svg.appendChild(line);
      for (const p of byName[name]) {
        const dot = document.createElementNS(SVG, "circle");
        dot.setAttribute("class", "point line-" + (index % LINE_CLASSES));
        dot.setAttribute("cx", x(p.t));
        dot.setAttribute("cy", y(p.v));
        dot.setAttribute("r", 2);
        svg.appendChild(dot);
      }
    });
    const unit = key.endsWith("latency") ? " ms" : "/s";
    const label = names.map(function (name) {
      const list = byName[name];
      return name + " " + list[list.length - 1].v.toFixed(unit === " ms" ? 2 : 1) + unit;
    });
    figure.querySelector('[data-field="last"]').textContent =
      "(latest: " + label.join(", ") + "; top of the chart " + top.toFixed(1) + unit + ")";
  }

  function status(snap) {
    const failed = snap.endpoints.filter((e) => e.error);
    const node = root.querySelector('[data-field="status"]');
    node.textContent = failed.length
      ? failed.map((e) => e.name + ": " + e.error).join("; ")
      : "Updated " + new Date(snap.time_ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  async function poll() {
    try {
      const reply = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (reply.ok) {
        const snap = await reply.json();
        sample(snap);
        status(snap);
        for (const figure of root.querySelectorAll("figure[data-series]")) {
          draw(figure, figure.dataset.series);
        }
      }
    } catch (error) {
      // A lost poll: the next one tries again.
    }
    setTimeout(poll, pollMs);
  }

  poll();
})();
