/* vnetbench HTML report: draws the charts, the trial selector and the comparison table.
 * Data and plotly.js come packed in <script type="application/json"> elements (gzip + base64, see
 * html_payload.py); nothing is fetched.
 * Text from users reaches the DOM only through textContent / Option(), never innerHTML. */
(function () {
  "use strict";
  var root = document.documentElement;
  var status = { total: 0, rendered: 0, errors: [] };
  window.vnbStatus = status;
  root.setAttribute("data-vnb-charts", "pending");

  /* ------------------------------------------------------------ unpacking */

  // plotly.js and the chart data come as {"packed": "gzip+base64", "data": ...} (html_payload.py), unpacked
  // with the browser's own DecompressionStream: the page stays one file, a third of its plain size.
  function unpack(id) {
    var block = JSON.parse(document.getElementById(id).textContent);
    if (!block || block.packed !== "gzip+base64") throw new Error("#" + id + " is not a gzip+base64 block");
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot unpack the report's charts (no DecompressionStream; " +
        "Chrome 80, Firefox 113, Safari 16.4 or newer can)");
    }
    var bin = atob(block.data);
    var bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
  }

  function runPlotly(js) {
    // An inline script: the Content Security Policy lets it run by the hash of exactly this text.
    var el = document.createElement("script");
    el.textContent = js;
    document.head.appendChild(el);
    el.remove();  // it has run; the page keeps its three script elements
    if (typeof window.Plotly === "undefined") {
      throw new Error("plotly.js did not load (refused by the page's Content Security Policy?)");
    }
  }

  function failed(message) {
    status.errors.push(message);
    root.setAttribute("data-vnb-charts", "error");
    Array.prototype.forEach.call(document.querySelectorAll("[data-chart]"), function (el) {
      el.setAttribute("data-rendered", "error");
      el.textContent = "The charts could not be drawn: " + message;
    });
  }

  // fn's value (or promise); a failure names what failed.
  function attempt(what, fn) {
    return new Promise(function (resolve) { resolve(fn()); }).then(null, function (err) {
      throw new Error(what + ": " + (err && err.message ? err.message : err));
    });
  }

  Promise.all([
    attempt("data", function () { return unpack("vnb-data").then(JSON.parse); }),
    attempt("plotly.js", function () { return unpack("vnb-plotly").then(runPlotly); })
  ]).then(function (parts) { drawCharts(parts[0]); }, function (err) { failed(err.message); });

  function drawCharts(DATA) {
    var PLOT_CONFIG = {
      displaylogo: false,
      responsive: true,
      modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"],
      toImageButtonOptions: { format: "png", scale: 2 }
    };
    var facets = DATA.facets || [];
    var facet = facets.length ? facets[0].id : "all";

    function clone(o) { return JSON.parse(JSON.stringify(o)); }

    /* ------------------------------------------------------------ charts */

    function specFor(id) {
      var c = DATA.charts[id];
      if (!c) return null;
      if (c.facets) return c.facets[facet] || c.facets.all || null;
      return c;
    }

    function drawSpec(el, spec) {
      if (!spec) {
        if (el.classList.contains("js-plotly-plot")) window.Plotly.purge(el);
        el.textContent = "";
        var p = document.createElement("p");
        p.className = "empty";
        p.textContent = "No values for this metric in the selected view.";
        el.appendChild(p);
        el.setAttribute("data-rendered", "empty");
        return Promise.resolve();
      }
      if (!el.classList.contains("js-plotly-plot")) el.textContent = "";
      // The container carries the figure's height, so cards never clip a chart (print included).
      if (spec.layout.height) el.style.height = spec.layout.height + "px";
      return window.Plotly.react(el, clone(spec.data), clone(spec.layout), PLOT_CONFIG).then(function () {
        el.setAttribute("data-rendered", "1");
      });
    }

    function render(el) {
      var id = el.getAttribute("data-chart");
      var done;
      try {
        done = id === "timeseries" ? drawTrial() : drawSpec(el, specFor(id));
      } catch (err) {
        done = Promise.reject(err);
      }
      return done.then(null, function (err) {
        status.errors.push(id + ": " + err);
        el.setAttribute("data-rendered", "error");
        el.textContent = "This chart could not be drawn: " + err;
      });
    }

    var charts = Array.prototype.slice.call(document.querySelectorAll("[data-chart]"));
    status.total = charts.length;
    var queue = [];
    var pumping = false;

    function enqueueAll() {
      queue = charts.slice();
      charts.forEach(function (el) { el.setAttribute("data-rendered", "pending"); });
      root.setAttribute("data-vnb-charts", "pending");
      status.rendered = 0;
      pump();
    }

    function pump() {
      if (pumping) return;
      if (!queue.length) {
        root.setAttribute("data-vnb-charts", status.errors.length ? "error" : "done");
        return;
      }
      pumping = true;
      var el = queue.shift();
      render(el).then(function () {
        status.rendered += 1;
        pumping = false;
        setTimeout(pump, 0);
      });
    }

    // Charts on screen jump the queue, so the page is usable before the last chart is drawn.
    if ("IntersectionObserver" in window) {
      var io = new IntersectionObserver(function (items) {
        items.forEach(function (it) {
          if (!it.isIntersecting) return;
          var i = queue.indexOf(it.target);
          if (i > 0) { queue.splice(i, 1); queue.unshift(it.target); }
        });
      }, { rootMargin: "200px" });
      charts.forEach(function (el) { io.observe(el); });
    }

    /* ------------------------------------------------------------ facets */

    var facetSelect = document.getElementById("facet");
    var facetPrint = document.getElementById("facet-print");
    function showFacetForPrint() {
      if (facetPrint && facetSelect) facetPrint.textContent = "Showing " + facetSelect.options[facetSelect.selectedIndex].text;
    }
    if (facetSelect) {
      facetSelect.addEventListener("change", function () {
        facet = facetSelect.value;
        showFacetForPrint();
        fillConfigs();
        enqueueAll();
      });
      showFacetForPrint();
    }

    /* ------------------------------------------------------------ time series */

    var S = DATA.series || null;
    var tsConfig = document.getElementById("ts-config");
    var tsTrial = document.getElementById("ts-trial");
    var tsStatus = document.getElementById("ts-status");
    var tsChart = document.getElementById("chart-timeseries");
    var byEntry = {};
    var order = [];  // trial indices in selector order
    var current = -1;

    // [lo, hi, base64 of little-endian uint16] -> numbers (65535 = gap); [t0, dt] -> t0 + i * dt.
    function decode(p, n) {
      var out, i;
      if (p.length === 2) {
        out = new Array(n);
        for (i = 0; i < n; i++) out[i] = p[0] + i * p[1];
        return out;
      }
      var bin = atob(p[2]);
      var len = bin.length >> 1;
      var step = (p[1] - p[0]) / 65534;
      out = new Array(len);
      for (i = 0; i < len; i++) {
        var q = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
        out[i] = q === 65535 ? null : p[0] + q * step;
      }
      return out;
    }

    function hostColour(host, hosts) {
      var i = hosts.indexOf(host);
      return i < 0 ? "#555555" : S.palette[i % S.palette.length];
    }

    function fillConfigs() {
      if (!S || !tsConfig) return;
      var keep = current >= 0 ? S.trials[current].entry : null;
      tsConfig.textContent = "";
      var seen = {};
      S.trials.forEach(function (t, i) {
        if (!t.series.length) return;
        if (!byEntry[t.entry]) byEntry[t.entry] = [];
        if (byEntry[t.entry].indexOf(i) < 0) byEntry[t.entry].push(i);
      });
      order = [];
      S.entries.forEach(function (ent, idx) {
        if (!byEntry[idx] || seen[idx]) return;
        seen[idx] = true;
        var label = ent.label;
        if (facets.length > 1 && ent.facet !== facet) label += "  (other view)";
        tsConfig.appendChild(new Option(label, String(idx)));
        byEntry[idx].forEach(function (i) { order.push(i); });
      });
      if (keep !== null && byEntry[keep]) tsConfig.value = String(keep);
      else if (facets.length > 1) {
        for (var k = 0; k < S.entries.length; k++) {
          if (byEntry[k] && S.entries[k].facet === facet) { tsConfig.value = String(k); break; }
        }
      }
      fillTrials();
    }

    function fillTrials() {
      tsTrial.textContent = "";
      var list = byEntry[Number(tsConfig.value)] || [];
      list.forEach(function (i) {
        var t = S.trials[i];
        var text = "repetition " + t.rep + " · " + t.status + (t.reason ? " (" + t.reason.slice(0, 60) + ")" : "");
        tsTrial.appendChild(new Option(text, String(i)));
      });
      var pick = list.indexOf(current) >= 0 ? current : list[0];
      if (pick !== undefined) tsTrial.value = String(pick);
      current = pick === undefined ? -1 : pick;
    }

    function drawTrial() {
      if (!S || current < 0) return Promise.resolve();
      var t = S.trials[current];
      var rows = S.rows.filter(function (r) {
        return t.series.some(function (item) { return S.kinds[item.k].row === r.id; });
      });
      var n = Math.max(rows.length, 1);
      var gap = n > 1 ? 0.08 : 0;
      var h = (1 - gap * (n - 1)) / n;
      var layout = clone(S.layout);
      var axisOf = {};
      rows.forEach(function (r, i) {
        var name = i === 0 ? "yaxis" : "yaxis" + (i + 1);
        var top = 1 - i * (h + gap);
        var ax = clone(S.layout.yaxis);
        ax.title = { text: r.title };
        ax.domain = [Math.max(0, top - h), top];
        ax.anchor = "x";
        ax.rangemode = "tozero";
        layout[name] = ax;
        axisOf[r.id] = i === 0 ? "y" : "y" + (i + 1);
      });
      layout.xaxis.anchor = axisOf[rows[rows.length - 1] ? rows[rows.length - 1].id : ""] || "y";
      var hosts = [];
      t.series.forEach(function (item) {
        var h = S.kinds[item.k].host;
        if (h && hosts.indexOf(h) < 0) hosts.push(h);
      });
      hosts.sort();
      var notes = [];
      var traces = t.series.map(function (item) {
        var s = S.kinds[item.k];
        var y = decode(item.v), x = decode(item.t, y.length);
        if (item.n) notes.push(s.name + ": " + y.length + " of " + item.n + " points shown");
        var perSecond = s.kind !== "rtt_ms";
        return {
          type: "scatter", mode: perSecond && x.length <= 120 ? "lines+markers" : "lines",
          x: x, y: y, name: s.name, yaxis: axisOf[s.row] || "y",
          line: { color: hostColour(s.host, hosts), width: perSecond ? 2 : 1, dash: s.kind === "srtt_ms" ? "dash" : "solid" },
          marker: { size: 5 },
          hovertemplate: "%{x:.2f} s: %{y:.4g} " + s.unit + "<extra>" + s.name + "</extra>"
        };
      });
      var ent = S.entries[t.entry];
      if (tsStatus) {
        tsStatus.textContent = ent.label + " · repetition " + t.rep + " · " + t.status +
          (t.reason ? " — " + t.reason : "") + (notes.length ? " · downsampled: " + notes.join("; ") : "");
        tsStatus.className = t.status === "ok" ? "note" : "note bad";
      }
      if (tsChart.getAttribute("data-rendered") !== "1" && !tsChart.classList.contains("js-plotly-plot")) tsChart.textContent = "";
      if (layout.height) tsChart.style.height = layout.height + "px";
      return window.Plotly.react(tsChart, traces, layout, PLOT_CONFIG).then(function () {
        tsChart.setAttribute("data-rendered", "1");
      });
    }

    function step(delta) {
      if (!order.length) return;
      var i = order.indexOf(current);
      var next = order[(i + delta + order.length) % order.length];
      current = next;
      tsConfig.value = String(S.trials[next].entry);
      fillTrials();
      tsTrial.value = String(next);
      drawTrial();
    }

    if (S && tsConfig && tsTrial) {
      fillConfigs();
      tsConfig.addEventListener("change", function () { current = -1; fillTrials(); drawTrial(); });
      tsTrial.addEventListener("change", function () { current = Number(tsTrial.value); drawTrial(); });
      document.getElementById("ts-prev").addEventListener("click", function () { step(-1); });
      document.getElementById("ts-next").addEventListener("click", function () { step(1); });
    }


    /* ------------------------------------------------------------ print */

    var openedForPrint = [];
    function resizeAll() {
      Array.prototype.forEach.call(document.querySelectorAll(".js-plotly-plot"), function (el) {
        try { window.Plotly.Plots.resize(el); } catch (err) { /* not drawn yet */ }
      });
    }
    window.addEventListener("beforeprint", function () {
      // Draw whatever is still queued, open collapsed sections, fit charts to the paper.
      while (queue.length) render(queue.shift());
      Array.prototype.forEach.call(document.querySelectorAll("details:not([open])"), function (d) {
        d.open = true;
        openedForPrint.push(d);
      });
      document.body.classList.add("printing");
      resizeAll();
    });
    window.addEventListener("afterprint", function () {
      openedForPrint.forEach(function (d) { d.open = false; });
      openedForPrint = [];
      document.body.classList.remove("printing");
      resizeAll();
    });


    enqueueAll();
  }

  /* ------------------------------------------------------------ comparison table */

  var table = document.getElementById("cmp-table");
  if (table) {
    var tbody = table.tBodies[0];
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var allRows = Array.prototype.slice.call(tbody.rows);
    var rowText = allRows.map(function (r) { return r.textContent.toLowerCase(); });
    var filterInput = document.getElementById("cmp-filter");
    var pairSelect = document.getElementById("cmp-pair");
    var verdictBoxes = Array.prototype.slice.call(document.querySelectorAll(".cmp-verdict"));
    var countEl = document.getElementById("cmp-count");

    var cellKey = function (row, col) {
      var c = row.cells[col];
      var v = c.getAttribute("data-v");
      return v === null ? c.textContent.trim() : v;
    };

    heads.forEach(function (th, col) {
      var numeric = th.getAttribute("data-type") === "num";
      th.querySelector("button").addEventListener("click", function () {
        var dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir);
        var sign = dir === "ascending" ? 1 : -1;
        var rows = Array.prototype.slice.call(tbody.rows);
        var keyed = rows.map(function (r, i) {
          var k = cellKey(r, col);
          return { r: r, i: i, k: numeric ? (k === "" ? null : parseFloat(k)) : k.toLowerCase() };
        });
        keyed.sort(function (a, b) {
          if (a.k === null || (numeric && isNaN(a.k))) return (b.k === null || (numeric && isNaN(b.k))) ? a.i - b.i : 1;
          if (b.k === null || (numeric && isNaN(b.k))) return -1;
          if (a.k < b.k) return -sign;
          if (a.k > b.k) return sign;
          return a.i - b.i;
        });
        var frag = document.createDocumentFragment();
        keyed.forEach(function (x) { frag.appendChild(x.r); });
        tbody.appendChild(frag);
      });
    });

    var applyFilter = function () {
      var q = filterInput ? filterInput.value.trim().toLowerCase() : "";
      var terms = q ? q.split(/\s+/) : [];
      var verdicts = {};
      verdictBoxes.forEach(function (b) { verdicts[b.value] = b.checked; });
      var pair = pairSelect ? pairSelect.value : "";
      var shown = 0;
      allRows.forEach(function (r, i) {
        var ok = verdicts[r.getAttribute("data-verdict")] !== false &&
          (!pair || r.getAttribute("data-pair") === pair) &&
          terms.every(function (t) { return rowText[i].indexOf(t) >= 0; });
        r.hidden = !ok;
        if (ok) shown += 1;
      });
      if (countEl) countEl.textContent = "showing " + shown + " of " + allRows.length + " rows";
    };
    if (filterInput) filterInput.addEventListener("input", applyFilter);
    if (pairSelect) pairSelect.addEventListener("change", applyFilter);
    verdictBoxes.forEach(function (b) { b.addEventListener("change", applyFilter); });
    applyFilter();
  }
})();
