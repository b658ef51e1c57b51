// Draws the report's charts as inline SVG from #report-data, and filters the tables. Writes what it drew into
// the DOM: each chart's data-drawn (points), body[data-charts], body[data-points], body[data-ready].
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var COLORS = ["#2f6fdb", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0b7285", "#5c940d", "#862e9c", "#d9480f", "#495057"];
  var W = 460, H = 230, L = 58, R = 12, T = 10, B = 30;

  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function num(v) {
    if (v === 0) { return "0"; }
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-4) { return v.toExponential(2); }
    return String(Number(v.toPrecision(4)));
  }
  function ticks(lo, hi, n) {
    if (hi === lo) { return [lo]; }
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    var err = (hi - lo) / n / step;
    step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
    var out = [];
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) { out.push(Number(t.toPrecision(12))); }
    return out;
  }

  function draw(el, chart, multiRun) {
    var xs = [], ys = [];
    chart.lines.forEach(function (line) {
      line.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); });
    });
    if (!xs.length) { el.querySelector(".plot").textContent = "no points"; return 0; }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { var pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
    var sx = function (x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    var sy = function (y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };
    var svg = ['<svg viewBox="0 0 ' + W + " " + H + '" role="img" aria-label="' + esc(chart.title) + '">'];
    ticks(y0, y1, 4).forEach(function (t) {
      svg.push('<line x1="' + L + '" x2="' + (W - R) + '" y1="' + sy(t) + '" y2="' + sy(t) + '" stroke="#e9ecf1"/>');
      svg.push('<text x="' + (L - 6) + '" y="' + (sy(t) + 4) + '" font-size="10" text-anchor="end" fill="#6a7385">' + num(t) + "</text>");
    });
    ticks(x0, x1, 5).forEach(function (t) {
      svg.push('<text x="' + sx(t) + '" y="' + (H - B + 14) + '" font-size="10" text-anchor="middle" fill="#6a7385">' + num(t) + "</text>");
    });
    svg.push('<text x="' + (W - R) + '" y="' + (H - 4) + '" font-size="10" text-anchor="end" fill="#6a7385">step</text>');
    svg.push('<rect x="' + L + '" y="' + T + '" width="' + (W - L - R) + '" height="' + (H - T - B) + '" fill="none" stroke="#c9ced8"/>');
    var drawn = 0, legend = [];
    chart.lines.forEach(function (line, i) {
      var color = COLORS[i % COLORS.length];
      var d = line.points.map(function (p, j) { return (j ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); }).join("");
      var dashed = /^eval_/.test(line.key) && chart.id === "loss";
      svg.push('<path d="' + d + '" fill="none" stroke="' + color + '" stroke-width="1.8"' + (dashed ? ' stroke-dasharray="5,3"' : "") + "/>");
      line.points.forEach(function (p) {
        svg.push('<circle cx="' + sx(p[0]).toFixed(1) + '" cy="' + sy(p[1]).toFixed(1) + '" r="' + (line.points.length > 60 ? 1.2 : 2.4) + '" fill="' + color + '"/>');
        drawn += 1;
      });
      var name = multiRun ? line.run + " · " + line.key : line.key;
      legend.push('<span><i style="background:' + color + '"></i>' + esc(name) + "</span>");
    });
    svg.push("</svg>");
    var plot = el.querySelector(".plot");
    plot.innerHTML = svg.join("") + '<div class="legend">' + legend.join("") + '</div><div class="readout"></div>';
    var box = plot.querySelector("svg"), readout = plot.querySelector(".readout");
    box.addEventListener("mousemove", function (e) {
      var r = box.getBoundingClientRect();
      var x = x0 + ((e.clientX - r.left) / r.width * W - L) / (W - L - R) * (x1 - x0);
      var parts = chart.lines.map(function (line) {
        var best = null;
        line.points.forEach(function (p) { if (best === null || Math.abs(p[0] - x) < Math.abs(best[0] - x)) { best = p; } });
        return (multiRun ? line.run + " · " : "") + line.key + " " + (best ? num(best[1]) + " @" + best[0] : "-");
      });
      readout.textContent = parts.join("   ");
    });
    el.setAttribute("data-drawn", String(drawn));
    return drawn;
  }

  var total = 0, count = 0, multi = data.runs.length > 1;
  data.charts.forEach(function (chart) {
    var el = document.querySelector('.chart[data-chart="' + chart.id.replace(/"/g, '\\"') + '"]');
    if (!el) { console.error("no element for chart " + chart.id); return; }
    var n = draw(el, chart, multi);
    total += n;
    if (n) { count += 1; }
  });

  Array.prototype.forEach.call(document.querySelectorAll("input.search"), function (input) {
    input.addEventListener("input", function () {
      var table = document.getElementById(input.getAttribute("data-table"));
      var q = input.value.toLowerCase();
      Array.prototype.forEach.call(table.querySelectorAll("tr"), function (tr, i) {
        if (i) { tr.style.display = !q || tr.textContent.toLowerCase().indexOf(q) >= 0 ? "" : "none"; }
      });
    });
  });

  document.body.setAttribute("data-charts", String(count));
  document.body.setAttribute("data-points", String(total));
  document.body.setAttribute("data-ready", "1");
})();
