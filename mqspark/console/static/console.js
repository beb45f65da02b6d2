// The console's own script: htmx requests of a signed-in admin carry the page's CSRF token.
document.addEventListener("htmx:configRequest", (event) => {
  const token = document.querySelector('meta[name="csrf-token"]');
  if (token) {
    event.detail.headers["X-CSRF-Token"] = token.content;
  }
});

// The queue page's charts: depth, oldest claimable age and rate of each consumer group over time,
// from the monitor history the API serves; warn and abort verdicts as marked points.
const CHARTS = [
  ["depth", "Depth (messages)"],
  ["oldest_claimable_age_s", "Oldest claimable age (s)"],
  ["rate_per_s", "Rate (messages/s)"],
];
const COLOURS = ["#0b5cad", "#1e7b34", "#6b3fa0", "#a15c00", "#00838f", "#ad1457"];

function marks(times, values, at) {
  return times.map((t, i) => (at.includes(t) ? values[i] : null));
}

function drawCharts(box, history) {
  box.replaceChildren();
  const groups = Object.entries(history.groups);
  if (groups.length === 0) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.id = "charts-empty";
    empty.textContent = "No monitor history in this time.";
    box.append(empty);
    return;
  }
  for (const [key, title] of CHARTS) {
    const times = [...new Set(groups.flatMap(([, g]) => g.at))].sort((a, b) => a - b);
    const data = [times];
    const series = [{}];
    groups.forEach(([name, g], index) => {
      const byTime = new Map(g.at.map((t, i) => [t, g[key][i]]));
      const values = times.map((t) => (byTime.has(t) ? byTime.get(t) : null));
      data.push(values);
      series.push({ label: name, stroke: COLOURS[index % COLOURS.length], spanGaps: true });
      for (const [verdict, colour] of [["warn", "#e69500"], ["abort", "#b3261e"]]) {
        data.push(marks(times, values, g[verdict]));
        series.push({ label: `${name} ${verdict}`, stroke: colour, paths: () => null,
                      points: { show: true, size: 9, fill: colour } });
      }
    });
    const chart = document.createElement("div");
    chart.className = "chart";
    chart.dataset.series = key;
    chart.dataset.points = String(times.length);
    box.append(chart);
    new uPlot({ title, width: Math.min(box.clientWidth || 900, 1100), height: 220, series }, data, chart);
  }
}

function loadCharts() {
  const box = document.getElementById("charts");
  if (!box || typeof uPlot === "undefined") {
    return;
  }
  fetch(box.dataset.history)
    .then((answer) => answer.json())
    .then((history) => drawCharts(box, history));
}

document.addEventListener("DOMContentLoaded", loadCharts);
