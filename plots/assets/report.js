// report.js draws the report page's charts with uPlot from the data each
// section embeds (a script element of type application/json, read by
// plots.SeriesData and plots.LatencyData), and sorts its tables by a click
// on a column's header. When done it sets window.reportReady to the number
// of charts drawn and the errors met (.ci/report-check reads it).
(function () {
  "use strict";
  var MiB = 1048576, GiB = 1073741824;
  var errors = [];
  // dragging is set while a mouse button is down: a drag selects a range.
  var dragging = false;
  document.addEventListener("mousedown", function () { dragging = true; }, true);
  document.addEventListener("mouseup", function () { dragging = false; }, true);

  // decode rebuilds the integers of a plots.Column: zigzag deltas in
  // groups of 5 bits, lowest first, a character of DIGITS each (32 added
  // where another group follows), times the column's step. Arithmetic,
  // not bit operations, so that values up to 2^53 stay exact.
  var DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  var digit = {};
  for (var k = 0; k < 64; k++) digit[DIGITS.charAt(k)] = k;
  function decode(c) {
    var out = [], v = 0, z = 0, mul = 1, s = c.d;
    for (var i = 0; i < s.length; i++) {
      var g = digit[s.charAt(i)];
      if (g === undefined) throw new Error("bad digit " + s.charAt(i) + " in a column");
      z += (g % 32) * mul;
      if (g >= 32) { mul *= 32; continue; }
      v += z % 2 ? -(z + 1) / 2 : z / 2;
      out.push(v * c.q);
      z = 0; mul = 1;
    }
    return out;
  }
  // columns returns a function giving the values of d.columns[i], each
  // decoded once; null for -1.
  function columns(d) {
    var cache = {};
    return function (i) {
      if (i < 0 || i == null) return null;
      if (!cache[i]) cache[i] = decode(d.columns[i]);
      return cache[i];
    };
  }
  window.reportDecode = decode;

  // niceStep is the smallest of m * 10^k (m in 1, 2, 2.5, 5) at least raw.
  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var ms = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < ms.length; i++) if (ms[i] * p >= raw * (1 - 1e-9)) return ms[i] * p;
    return 10 * p;
  }
  function niceTop(top) {
    var step = niceStep(top / 5);
    return Math.max(Math.ceil(top / step - 1e-6), 1) * step;
  }
  function decimals(step) {
    var d = 0;
    while (d < 9 && Math.abs(Math.round(step * Math.pow(10, d)) - step * Math.pow(10, d)) > 1e-6) d++;
    return d;
  }
  // linearSplits puts ticks at multiples of a round step from 0.
  function linearSplits(u, ax, min, max) {
    var step = niceStep((max - min) / 5), out = [];
    for (var k = Math.ceil(min / step - 1e-9); k * step <= max + step * 1e-9; k++) out.push(k === 0 ? 0 : k * step);
    return out;
  }
  function tint(hex, f) {
    var n = parseInt(hex.slice(1), 16), r = n >> 16, g = (n >> 8) & 255, b = n & 255;
    var mix = function (v) { return Math.round(v + (255 - v) * f); };
    return "rgb(" + mix(r) + "," + mix(g) + "," + mix(b) + ")";
  }
  function mib(b) { return (b / MiB).toFixed(1); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }
  // fmtX prints an X of the cursor: seconds to a thousandth of the shown
  // range (u's X scale), or an event index.
  function fmtX(unit, v, u) {
    if (v == null) return "";
    if (unit !== "s") return "event " + Math.round(v);
    var span = u ? u.scales.x.max - u.scales.x.min : 0;
    var dec = span > 0 ? Math.min(Math.max(Math.ceil(-Math.log10(span / 1000)), 0), 9) : 4;
    return v.toFixed(dec) + " s";
  }
  // xAxis is the X axis of a series chart: seconds or events, its labels
  // with the decimals of its ticks' step.
  function xAxis(unit) {
    return { label: unit === "s" ? "time (s)" : "events", grid: { stroke: "#eee" },
      values: function (u, vals) {
        if (vals.length < 2) return vals.map(String);
        var dec = decimals(Math.abs(vals[1] - vals[0]));
        return vals.map(function (v) { return v == null ? "" : v.toFixed(dec); });
      } };
  }

  // A group holds the charts of one section, which share their cursor,
  // their zoom and which policies are shown.
  function Group(id) {
    this.id = id;
    this.charts = [];
    this.syncing = false;
  }
  Group.prototype.zoom = function (from, min, max) {
    if (this.syncing) return;
    this.syncing = true;
    this.charts.forEach(function (c) {
      if (c.u !== from && c.timeX) c.u.setScale("x", { min: min, max: max });
    });
    this.syncing = false;
  };
  Group.prototype.toggle = function (p, show) {
    this.charts.forEach(function (c) { c.showPolicy(p, show); });
  };

  // legend builds the list below a chart: the X under the cursor, then a
  // policy a line with its values there; a click hides or shows it.
  function legend(box, chart, pols, group) {
    var lg = el("div", "legend"), at = el("div", "at");
    lg.appendChild(at);
    var items = el("div", "items"), rows = [];
    pols.forEach(function (p, k) {
      var it = el("div", "item"), sw = el("span", "sw");
      sw.style.background = p.color;
      it.appendChild(sw);
      var name = el("span", "name", p.label);
      name.title = p.label;
      it.appendChild(name);
      var val = el("span", "val", "");
      it.appendChild(val);
      it.title = "click to hide or show " + p.label;
      it.addEventListener("click", function () {
        var show = it.classList.contains("off");
        group.toggle(k, show);
      });
      items.appendChild(it);
      rows.push({ item: it, val: val });
    });
    lg.appendChild(items);
    box.appendChild(lg);
    return { at: at, rows: rows, box: lg };
  }

  function baseOpts(width, height, group, timeX) {
    return {
      width: width,
      height: height,
      legend: { show: false },
      cursor: {
        sync: { key: group.id },
        drag: { x: true, y: false, setScale: true },
        points: { show: false },
        focus: { prox: 12 },
        // The cursor's line stands on the point whose values the legend
        // shows, not between points; not while a drag selects a range.
        move: function (u, left, top) {
          if (dragging) return [left, top];
          var i = u.posToIdx(left), x = i == null ? null : u.data[0][i];
          return x == null ? [left, top] : [Math.round(u.valToPos(x, "x")), top];
        }
      },
      focus: { alpha: 0.4 },
      scales: { x: { time: false } },
      hooks: {}
    };
  }

  // memoryChart draws memory over the trace: per policy its reserved,
  // allocated and footprint bytes, and the requested bytes.
  function memoryChart(fig, d, group) {
    var col = columns(d);
    var xs = d.x.map(col), evs = (d.events || []).map(col);
    var toX = d.xunit === "s" ? function (v) { return v / 1e9; } : function (v) { return v; };
    // One table per X column, each [x, its series...]; uPlot.join aligns
    // them on the union of their X where there are several.
    var tables = xs.map(function (x) { return [x.map(toX)]; });
    var specs = xs.map(function () { return []; });
    var top = d.capacity || 0;
    function add(xi, vals, spec) {
      tables[xi].push(vals);
      specs[xi].push(spec);
      for (var i = 0; i < vals.length; i++) if (vals[i] > top) top = vals[i];
    }
    xs.forEach(function (x, xi) {
      if (d.xunit === "s") add(xi, evs[xi], { kind: "events", scale: "ev", show: false });
    });
    if (d.requested >= 0) add(d.requested_x, col(d.requested), { kind: "requested", label: "requested (lower bound)", stroke: "#000", width: 1.5, dash: [6, 3] });
    var pols = d.policies;
    pols.forEach(function (p, k) {
      if (p.x < 0) return;
      add(p.x, col(p.allocated), { kind: "allocated", pol: k, label: p.label + " allocated", stroke: tint(p.color, 0.15), width: 1, dash: [3, 2] });
      if (p.footprint >= 0) add(p.x, col(p.footprint), { kind: "footprint", pol: k, label: p.label + " footprint", stroke: p.color, width: 1, dash: [1, 2] });
      add(p.x, col(p.reserved), { kind: "reserved", pol: k, label: p.label + " reserved", stroke: p.color, width: 2, dash: p.dash });
    });
    var data = tables.length === 1 ? tables[0] : uPlot.join(tables);
    var all = [];
    specs.forEach(function (s) { all = all.concat(s); });
    var unit = top >= GiB ? GiB : MiB, uname = unit === GiB ? "GiB" : "MiB";
    var series = [{ label: d.xunit === "s" ? "time (s)" : "event" }];
    all.forEach(function (s) {
      series.push(s.kind === "events" ? { label: "event", scale: "ev", show: false } :
        { label: s.label, stroke: s.stroke, width: s.width, dash: s.dash, spanGaps: true, points: { show: false }, paths: steps });
    });
    var hasFootprint = pols.some(function (p) { return p.footprint >= 0; });
    var evIdx = -1;
    all.forEach(function (s, i) { if (s.kind === "events" && evIdx < 0) evIdx = i + 1; });
    // OOM crosses: at the X of the OOM's point, on its reserved bytes.
    var ooms = [];
    pols.forEach(function (p, k) {
      if (p.oom >= 0 && p.x >= 0) ooms.push({ pol: k, x: toX(xs[p.x][p.oom]), y: col(p.reserved)[p.oom], color: p.color });
    });
    var w = fig.clientWidth || 1000;
    var opts = baseOpts(w, 380, group, true);
    opts.series = series;
    opts.scales.y = { range: function (u, lo, hi) { return [0, niceTop(Math.max(hi || 0, d.capacity || 0, 0.1 * MiB))]; } };
    opts.scales.ev = { range: [0, 1] };
    opts.axes = [
      xAxis(d.xunit),
      { label: "memory (" + uname + ")", size: 60, grid: { stroke: "#e4e4e4" },
        splits: function (u, ax, lo, hi) { return linearSplits(u, ax, lo / unit, hi / unit).map(function (v) { return v * unit; }); },
        values: function (u, vals) {
          if (vals.length < 2) return vals.map(function (v) { return (v / unit).toString(); });
          var dec = decimals((vals[1] - vals[0]) / unit);
          return vals.map(function (v) { return (v / unit).toFixed(dec); });
        } }
    ];
    var c = { timeX: true, fig: fig };
    var lg;
    opts.hooks.draw = [function (u) {
      var ctx = u.ctx, r = uPlot.pxRatio;
      ctx.save();
      ctx.beginPath();
      ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
      ctx.clip();
      if (d.capacity) {
        var y = Math.round(u.valToPos(d.capacity, "y", true)) + 0.5;
        ctx.strokeStyle = "#707070";
        ctx.lineWidth = r;
        ctx.setLineDash([2 * r, 3 * r]);
        ctx.beginPath();
        ctx.moveTo(u.bbox.left, y);
        ctx.lineTo(u.bbox.left + u.bbox.width, y);
        ctx.stroke();
        ctx.setLineDash([]);
        ctx.fillStyle = "#555";
        ctx.font = (11 * r) + "px sans-serif";
        ctx.textAlign = "left";
        ctx.fillText("device capacity " + mib(d.capacity) + " MiB", u.bbox.left + 4 * r, y - 4 * r);
      }
      ooms.forEach(function (o) {
        if (c.hidden && c.hidden[o.pol]) return;
        var x = u.valToPos(o.x, "x", true), y = u.valToPos(o.y, "y", true), s = 6 * r;
        ctx.strokeStyle = o.color;
        ctx.lineWidth = 2.5 * r;
        ctx.beginPath();
        ctx.moveTo(x - s, y - s); ctx.lineTo(x + s, y + s);
        ctx.moveTo(x - s, y + s); ctx.lineTo(x + s, y - s);
        ctx.stroke();
      });
      ctx.restore();
    }];
    opts.hooks.setCursor = [function (u) {
      var i = u.cursor.idx;
      if (i == null) { lg.at.textContent = "reserved / allocated MiB at the cursor (move over the chart)"; lg.rows.forEach(function (r) { r.val.textContent = ""; }); return; }
      var t = fmtX(d.xunit, u.data[0][i], u);
      if (evIdx > 0 && u.data[evIdx][i] != null) t += ", event " + u.data[evIdx][i];
      var req = null;
      all.forEach(function (s, j) { if (s.kind === "requested") req = u.data[j + 1][i]; });
      lg.at.textContent = "at " + t + (req != null ? ": requested " + mib(req) + " MiB" : "") + "; reserved / allocated MiB" + (hasFootprint ? " (footprint)" : "") + ":";
      var vals = pols.map(function () { return {}; });
      all.forEach(function (s, j) { if (s.pol != null) vals[s.pol][s.kind] = u.data[j + 1][i]; });
      lg.rows.forEach(function (r, k) {
        var v = vals[k];
        if (v.reserved == null) { r.val.textContent = "-"; return; }
        var t = mib(v.reserved) + " / " + mib(v.allocated);
        if (v.footprint != null) t += " (" + mib(v.footprint) + ")";
        r.val.textContent = t;
      });
    }];
    opts.hooks.setScale = [function (u, key) {
      if (key === "x") group.zoom(u, u.scales.x.min, u.scales.x.max);
    }];
    opts.hooks.setSeries = [function (u, si, o) { focusLegend(u, si, all, lg); }];
    var plot = fig.querySelector(".plot");
    var u = new uPlot(opts, data, plot);
    c.u = u;
    c.hidden = {};
    lg = legend(plot, c, pols, group);
    kindToggles(lg.box, u, all, group);
    c.showPolicy = function (k, show) {
      c.hidden[k] = !show;
      u.batch(function () {
        all.forEach(function (s, j) {
          if (s.pol === k && !(c.kindOff && c.kindOff[s.kind])) u.setSeries(j + 1, { show: show });
        });
      });
      lg.rows[k].item.classList.toggle("off", !show);
      u.redraw(false);
    };
    c.all = all;
    u.setCursor({ left: -10, top: -10 });
    return c;
  }

  // focusLegend marks the policy of the focused series in the legend.
  function focusLegend(u, si, all, lg) {
    if (!lg) return;
    var k = si != null && si > 0 && all[si - 1] ? all[si - 1].pol : null;
    if (u.cursor.idx == null) k = null;
    lg.rows.forEach(function (r, j) { r.item.classList.toggle("focus", j === k); });
  }

  // kindToggles adds the switches of the memory chart's kinds of line.
  function kindToggles(box, u, all, group) {
    var kinds = [["reserved", "reserved"], ["allocated", "allocated"], ["footprint", "footprint"], ["requested", "requested"]];
    var div = el("div", "kinds");
    div.appendChild(document.createTextNode("lines: "));
    var chart = null;
    kinds.forEach(function (kd) {
      var has = all.some(function (s) { return s.kind === kd[0]; });
      if (!has) return;
      var lab = el("label"), cb = el("input");
      cb.type = "checkbox";
      cb.checked = true;
      lab.appendChild(cb);
      lab.appendChild(document.createTextNode(" " + kd[1]));
      cb.addEventListener("change", function () {
        group.charts.forEach(function (c) { if (c.u === u) chart = c; });
        chart.kindOff = chart.kindOff || {};
        chart.kindOff[kd[0]] = !cb.checked;
        u.batch(function () {
          all.forEach(function (s, j) {
            if (s.kind === kd[0] && !(s.pol != null && chart.hidden[s.pol])) u.setSeries(j + 1, { show: cb.checked });
          });
        });
      });
      div.appendChild(lab);
    });
    [["all", true], ["none", false]].forEach(function (b) {
      var btn = el("button", null, b[0]);
      btn.type = "button";
      btn.title = b[1] ? "show every policy" : "hide every policy";
      btn.addEventListener("click", function () {
        var n = 0;
        group.charts.forEach(function (c) { n = Math.max(n, c.npol || 0); });
        for (var k = 0; k < n; k++) group.toggle(k, b[1]);
      });
      div.appendChild(btn);
    });
    box.appendChild(div);
  }

  // steps draws a series of window maxima (sim.Point: the largest value of
  // the run of events ending at its x) as steps, each value level from the
  // point before to its own, as the PNG charts do.
  var steps = uPlot.paths.stepped({ align: -1 });

  // fragChart draws the idle share over the trace, a line per policy, and
  // its fragmentation, dots where a malloc grew past free memory.
  function fragChart(fig, d, group) {
    var col = columns(d);
    var xs = d.x.map(col);
    var toX = d.xunit === "s" ? function (v) { return v / 1e9; } : function (v) { return v; };
    var tables = xs.map(function (x) { return [x.map(toX)]; });
    var specs = xs.map(function () { return []; });
    var top = 0;
    d.policies.forEach(function (p, k) {
      if (p.x < 0) return;
      var idle = col(p.idle).map(function (f) { return f / 100; });
      var frag = col(p.fragmentation).map(function (f) { return f > 0 ? f / 100 : null; });
      idle.concat(frag).forEach(function (f) { if (f > top) top = f; });
      tables[p.x].push(idle, frag);
      specs[p.x].push({ pol: k, kind: "idle", label: p.label + " idle", stroke: p.color, dash: p.dash },
        { pol: k, kind: "frag", label: p.label + " fragmentation", stroke: p.color });
    });
    var data = tables.length === 1 ? tables[0] : uPlot.join(tables);
    var all = [];
    specs.forEach(function (s) { all = all.concat(s); });
    var opts = baseOpts(fig.clientWidth || 1000, 240, group, true);
    opts.series = [{ label: "x" }].concat(all.map(function (s) {
      if (s.kind === "frag") {
        return { label: s.label, stroke: s.stroke, width: 0, spanGaps: false, paths: function () { return null; },
          points: { show: true, size: 8, width: 1, stroke: s.stroke, fill: s.stroke } };
      }
      return { label: s.label, stroke: s.stroke, width: 1.5, dash: s.dash, spanGaps: true, points: { show: false }, paths: steps };
    }));
    var yTop = niceTop(Math.min(Math.max(top, 10), 100));
    opts.scales.y = { range: [0, yTop] };
    opts.axes = [
      xAxis(d.xunit),
      { label: "% of the reserved bytes", size: 60, grid: { stroke: "#e4e4e4" }, splits: linearSplits }
    ];
    var c = { timeX: true, fig: fig };
    var lg;
    opts.hooks.setCursor = [function (u) {
      var i = u.cursor.idx;
      if (i == null) { lg.at.textContent = "idle share (line) and fragmentation (dots) at the cursor (move over the chart)"; lg.rows.forEach(function (r) { r.val.textContent = ""; }); return; }
      lg.at.textContent = "at " + fmtX(d.xunit, u.data[0][i], u) + ": idle, 1 − allocated / reserved; fragmentation, free memory that could not serve a malloc the policy grew for";
      var idle = {}, frag = {};
      all.forEach(function (s, j) { (s.kind === "frag" ? frag : idle)[s.pol] = u.data[j + 1][i]; });
      lg.rows.forEach(function (r, k) {
        var t = idle[k] == null ? "-" : "idle " + idle[k].toFixed(2) + "%";
        if (frag[k] != null) t += ", fragmentation " + frag[k].toFixed(2) + "%";
        r.val.textContent = t;
      });
    }];
    opts.hooks.setScale = [function (u, key) {
      if (key === "x") group.zoom(u, u.scales.x.min, u.scales.x.max);
    }];
    opts.hooks.setSeries = [function (u, si) { focusLegend(u, si, all, lg); }];
    var plot = fig.querySelector(".plot");
    var u = new uPlot(opts, data, plot);
    c.u = u;
    c.hidden = {};
    lg = legend(plot, c, d.policies, group);
    c.showPolicy = function (k, show) {
      c.hidden[k] = !show;
      all.forEach(function (s, j) { if (s.pol === k) u.setSeries(j + 1, { show: show }); });
      lg.rows[k].item.classList.toggle("off", !show);
    };
    u.setCursor({ left: -10, top: -10 });
    return c;
  }

  // shareAt returns a distribution's share at row i of x: its own where it
  // has a point there, else as its line is drawn, straight (on the log
  // scale) between its points on either side; 0 before its first, 100
  // after its last.
  function shareAt(x, ys, i) {
    if (ys[i] != null) return ys[i];
    var a = i, b = i;
    while (a >= 0 && ys[a] == null) a--;
    while (b < ys.length && ys[b] == null) b++;
    if (a < 0) return 0;
    if (b >= ys.length) return 100;
    var la = Math.log(x[a]), lb = Math.log(x[b]);
    return lb === la ? ys[b] : ys[a] + (ys[b] - ys[a]) * (Math.log(x[i]) - la) / (lb - la);
  }

  // latencyChart draws each policy's distribution of device call
  // latencies: the share of calls at or below a time, on a log scale.
  function latencyChart(fig, d, group) {
    var x = d.ns.map(function (ns) { return Math.max(ns, 1) / 1000; });
    var all = [], data = [x];
    d.policies.forEach(function (p, k) {
      if (!p.calls) return;
      data.push(p.share.map(function (v) { return v == null ? null : v / 100; }));
      all.push({ pol: k, label: p.label, stroke: p.color });
    });
    var lo = Math.floor(Math.log10(x[0])), hi = Math.ceil(Math.log10(x[x.length - 1]));
    if (hi - lo < 1) hi = lo + 1;
    var opts = baseOpts(fig.clientWidth || 1000, 280, { id: group.id + "-lat" }, false);
    opts.series = [{ label: "µs" }].concat(all.map(function (s) {
      return { label: s.label, stroke: s.stroke, width: 1.5, spanGaps: true, points: { show: false } };
    }));
    opts.scales.x = { time: false, distr: 3, log: 10, range: function (u, a, b) {
      if (a == null || u.status === 0 || (a <= Math.pow(10, lo) * 1.0001 && b >= Math.pow(10, hi) * 0.9999)) return [Math.pow(10, lo), Math.pow(10, hi)];
      return [a, b];
    } };
    opts.scales.y = { range: [0, 100] };
    function pow10Label(v) {
      if (v == null || !(v > 0)) return "";
      var e = Math.round(Math.log10(v));
      if (Math.abs(Math.log10(v) - e) > 1e-9) return "";
      var us = Math.pow(10, e);
      return us >= 1000 ? (us / 1000) + " ms" : us >= 1 ? us + " µs" : (us * 1000) + " ns";
    }
    opts.axes = [
      { label: "latency per call (log scale)", grid: { stroke: "#eee" }, values: function (u, vals) { return vals.map(pow10Label); } },
      { label: "calls at or below (%)", size: 60, grid: { stroke: "#e4e4e4" }, splits: function () { return [0, 20, 40, 60, 80, 100]; } }
    ];
    var lg;
    opts.hooks.setCursor = [function (u) {
      var i = u.cursor.idx;
      if (i == null) { lg.at.textContent = "share of calls at or below the cursor's latency (move over the chart)"; lg.rows.forEach(function (r) { r.val.textContent = ""; }); return; }
      var v = u.data[0][i];
      lg.at.textContent = "at " + (v >= 1000 ? (v / 1000).toFixed(3) + " ms" : v.toFixed(1) + " µs") + ": calls at or below";
      var vals = {};
      all.forEach(function (s, j) { vals[s.pol] = shareAt(u.data[0], u.data[j + 1], i); });
      lg.rows.forEach(function (r, k) {
        if (!d.policies[k].calls) { r.val.textContent = ""; return; }
        r.val.textContent = vals[k].toFixed(1) + "%";
      });
    }];
    opts.hooks.setSeries = [function (u, si) { focusLegend(u, si, all, lg); }];
    var plot = fig.querySelector(".plot");
    var u = new uPlot(opts, data, plot);
    var c = { timeX: false, fig: fig, u: u, hidden: {} };
    var own = { toggle: function (k, show) { c.showPolicy(k, show); } };
    lg = legend(plot, c, d.policies, own);
    d.policies.forEach(function (p, k) { if (!p.calls) lg.rows[k].item.classList.add("off"); });
    c.showPolicy = function (k, show) {
      if (!d.policies[k].calls) return;
      all.forEach(function (s, j) { if (s.pol === k) u.setSeries(j + 1, { show: show }); });
      lg.rows[k].item.classList.toggle("off", !show);
    };
    u.setCursor({ left: -10, top: -10 });
    return c;
  }

  function drawCharts() {
    var groups = {}, n = 0, charts = [];
    var figs = document.querySelectorAll("figure.chart");
    for (var i = 0; i < figs.length; i++) {
      var fig = figs[i];
      try {
        var src = document.getElementById(fig.getAttribute("data-src"));
        var data = JSON.parse(src.textContent);
        var gid = fig.getAttribute("data-src");
        var group = groups[gid] || (groups[gid] = new Group(gid));
        var kind = fig.getAttribute("data-kind"), c;
        if (kind === "memory") c = memoryChart(fig, data.series, group);
        else if (kind === "fragmentation") c = fragChart(fig, data.series, group);
        else if (kind === "latency") c = latencyChart(fig, data.latency, group);
        else throw new Error("unknown chart kind " + kind);
        c.npol = (kind === "latency" ? data.latency : data.series).policies.length;
        if (kind !== "latency") {
          // At first the policies the PNG charts draw; the others a click away.
          data.series.policies.forEach(function (p, k) { if (p.hidden) c.showPolicy(k, false); });
        }
        if (kind !== "latency") group.charts.push(c);
        charts.push(c);
        n++;
      } catch (e) {
        errors.push(fig.id + ": " + e);
        fig.querySelector(".plot").appendChild(el("p", "chart-error", "This chart could not be drawn: " + e));
        console.error("report: " + fig.id + ": " + e);
      }
    }
    // Charts follow their container's width.
    if (window.ResizeObserver) {
      var ro = new ResizeObserver(function (entries) {
        entries.forEach(function (en) {
          charts.forEach(function (c) {
            if (c.fig === en.target) {
              var w = Math.floor(en.contentRect.width);
              if (w > 0 && Math.abs(w - c.u.width) > 1) c.u.setSize({ width: w, height: c.u.height });
            }
          });
        });
      });
      charts.forEach(function (c) { ro.observe(c.fig); });
    }
    window.reportCharts = charts;
    return n;
  }

  // sortTables makes every table's header cells of class sortable sort
  // its rows: by the cells' data-v (numbers) where both have one, else
  // by their text; rows without a value last; a second click reverses.
  function sortTables() {
    var ths = document.querySelectorAll("th.sortable");
    Array.prototype.forEach.call(ths, function (th) {
      function sort() {
        var table = th.closest("table"), body = table.tBodies[0];
        var col = Array.prototype.indexOf.call(th.parentNode.cells, th);
        var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        Array.prototype.forEach.call(th.parentNode.cells, function (h) { if (h.classList.contains("sortable")) h.setAttribute("aria-sort", "none"); });
        th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        var rows = Array.prototype.slice.call(body.rows).map(function (r, i) {
          var c = r.cells[col], v = c ? c.getAttribute("data-v") : null, t = c ? c.textContent.trim() : "";
          return { r: r, i: i, n: v != null && v !== "" ? parseFloat(v) : null, t: t };
        });
        var numeric = rows.some(function (x) { return x.n != null; });
        rows.sort(function (a, b) {
          if (numeric) {
            if (a.n == null || b.n == null) return (a.n == null) - (b.n == null) || a.i - b.i;
            return dir * (a.n - b.n) || a.i - b.i;
          }
          if (!a.t || !b.t) return (!a.t) - (!b.t) || a.i - b.i;
          return dir * a.t.localeCompare(b.t, undefined, { numeric: true }) || a.i - b.i;
        });
        rows.forEach(function (x) { body.appendChild(x.r); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
    });
  }

  function main() {
    var n = 0;
    try {
      sortTables();
      n = drawCharts();
    } catch (e) {
      errors.push(String(e));
      console.error("report: " + e);
    }
    window.reportReady = { charts: n, errors: errors };
    document.documentElement.setAttribute("data-charts", String(n));
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", main);
  else main();
})();
