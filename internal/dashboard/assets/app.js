// The dashboard's script: refreshes the live tables and draws the charts
// from /api/snapshot. It writes text with textContent only, never HTML.
"use strict";
(function () {
  var body = document.body;
  var base = body.dataset.base || "";
  var interval = parseInt(body.dataset.interval, 10) || 2000;
  var page = body.dataset.page;
  var windowMs = parseInt(body.dataset.window, 10) || 300000;
  var SVG = "http://www.w3.org/2000/svg";

  function el(name, cls, text) {
    var e = document.createElement(name);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svgEl(name, attrs, text) {
    var e = document.createElementNS(SVG, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // fillTable replaces the rows of table id; link, if given, makes the
  // first cell a link.
  function fillTable(id, rows, link) {
    var table = document.getElementById(id);
    if (!table) return;
    var tbody = table.tBodies[0];
    var frag = document.createDocumentFragment();
    rows.forEach(function (r) {
      var tr = el("tr");
      tr.dataset.name = r.name;
      var first = el("td", link ? "" : "id");
      if (link) {
        var a = el("a", "", r.name);
        a.href = link(r.name);
        first.appendChild(a);
      } else {
        first.textContent = r.name;
      }
      tr.appendChild(first);
      r.cells.forEach(function (c) { tr.appendChild(el("td", id === "receivers" ? "num" : "", c)); });
      frag.appendChild(tr);
    });
    tbody.replaceChildren(frag);
    var empty = document.getElementById(id + "-empty");
    if (empty) empty.hidden = rows.length > 0;
  }

  function niceMax(v) {
    if (v <= 0) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= v) return steps[i] * p;
    return 10 * p;
  }

  function fmt(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    return Number.isInteger(v) ? String(v) : v.toFixed(1);
  }

  // drawChart draws the series named in the svg's data-series over the
  // history, the newest point at the right edge.
  function drawChart(svg, hist, windowMs) {
    var keys = svg.dataset.series.split(" ");
    var w = svg.clientWidth || 600, h = svg.clientHeight || 160;
    var left = 44, right = 8, top = 8, bottom = 20;
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("preserveAspectRatio", "none");
    var kids = [];
    var top2 = 0;
    hist.forEach(function (p) { keys.forEach(function (k) { top2 = Math.max(top2, p[k]); }); });
    var ymax = niceMax(top2);
    var now = hist.length ? hist[hist.length - 1].t : Date.now();
    var x = function (t) { return left + (w - left - right) * (1 - (now - t) / windowMs); };
    var y = function (v) { return top + (h - top - bottom) * (1 - v / ymax); };
    [0, 0.5, 1].forEach(function (f) {
      var yy = y(ymax * f);
      kids.push(svgEl("line", { "class": "grid", x1: left, x2: w - right, y1: yy, y2: yy }));
      kids.push(svgEl("text", { "class": "label", x: left - 6, y: yy + 4, "text-anchor": "end" }, fmt(ymax * f)));
    });
    var mins = Math.round(windowMs / 60000);
    kids.push(svgEl("text", { "class": "label", x: left, y: h - 4 }, "−" + mins + " min"));
    kids.push(svgEl("text", { "class": "label", x: w - right, y: h - 4, "text-anchor": "end" }, "now"));
    keys.forEach(function (k, i) {
      var pts = hist.map(function (p) { return x(p.t).toFixed(1) + "," + y(p[k]).toFixed(1); });
      if (i === 0 && pts.length > 1) {
        var area = pts.slice();
        area.push(x(now).toFixed(1) + "," + y(0), x(hist[0].t).toFixed(1) + "," + y(0));
        kids.push(svgEl("polygon", { "class": "area", points: area.join(" ") }));
      }
      kids.push(svgEl("polyline", { "class": "s" + i, points: pts.join(" ") }));
    });
    svg.replaceChildren.apply(svg, kids);
    svg.dataset.points = String(hist.length);
    svg.dataset.last = String(now);
  }

  function setText(id, text) {
    var e = document.getElementById(id);
    if (e) e.textContent = text;
  }

  // showSkipped lists what the poll left out, as it cannot read it.
  function showSkipped(skipped) {
    var box = document.getElementById("skipped");
    if (!box) return;
    skipped = skipped || [];
    box.hidden = skipped.length === 0;
    var list = document.getElementById("skipped-list");
    list.replaceChildren.apply(list, skipped.map(function (s) { return el("li", "", s); }));
  }

  function show(snap) {
    var err = document.getElementById("error");
    if (err) {
      err.hidden = !snap.error;
      setText("error-text", snap.error || "");
    }
    showSkipped(snap.skipped);
    if (page === "receivers") {
      fillTable("receivers", snap.receivers, function (name) {
        return base + "/receivers/" + encodeURIComponent(name);
      });
      document.querySelectorAll("svg.chart-svg").forEach(function (svg) { drawChart(svg, snap.history, windowMs); });
      var last = snap.history[snap.history.length - 1];
      if (last) {
        setText("now-rate", fmt(last.rate) + "/s");
        setText("now-depth", fmt(last.queued) + " queued, " + fmt(last.in_flight) + " in flight");
      }
    } else if (page === "workers") {
      fillTable("workers", snap.workers, null);
    }
  }

  function refresh() {
    fetch(base + "/api/snapshot", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(show)
      .catch(function (e) {
        var err = document.getElementById("error");
        if (err) {
          err.hidden = false;
          setText("error-text", "the dashboard does not answer (" + e.message + ")");
        }
      });
  }

  if (page === "receivers" || page === "workers") {
    refresh();
    setInterval(refresh, interval);
  }
})();
