// The page loom-trace --html writes: everything inline (style, script, data),
// so it opens from a file with no network. html_report.cc fills @TITLE@,
// @BODY@ (the tables, lists and empty heatmap boxes) and @DATA@ (the lateness
// matrix as JSON, '<' escaped). The script draws each heatmap as one element
// of class "cell" per rank and operation, coloured from pale yellow (on time)
// to dark red (the communicator's largest lateness), with a hover title.
#pragma once

namespace loom::tracetool {

inline constexpr const char kHtmlTemplate[] = R"LOOMHTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>@TITLE@</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 2em; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { padding: 2px 12px; text-align: right; border-bottom: 1px solid #ddd; }
th:first-child, td:first-child { text-align: left; }
tr.top td { font-weight: 600; }
.verdict { font-weight: 600; } .ok { color: #176b1b; } .bad { color: #b3161b; }
.heatwrap { overflow-x: auto; max-width: 100%; border: 1px solid #ccc; padding: 6px; }
.heatmap { display: grid; gap: 1px; width: max-content; }
.heatmap .rowlabel { font-size: 11px; padding-right: 6px; white-space: nowrap; text-align: right; }
.cell { height: 14px; }
.cell[data-state=missing], .swatch.missing { background: #263238; }
.cell[data-state=untimed], .swatch.untimed { background: #cfd8dc; }
.cell[data-state=evicted], .cell[data-state=nodump], .swatch.unknown {
  background: repeating-linear-gradient(45deg, #eee 0 3px, #b0b0b0 3px 5px); }
.legend { display: flex; align-items: center; gap: 8px; margin: 6px 0; font-size: 12px; }
.legend .bar { display: inline-block; width: 220px; height: 12px; border: 1px solid #999; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #999; }
ul.findings li { font-family: ui-monospace, monospace; font-size: 13px; }
</style>
</head>
<body>
<h1>@TITLE@</h1>
@BODY@
<script type="application/json" id="loom-data">@DATA@</script>
<script>
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("loom-data").textContent);
  var stateNames = { t: "timed", u: "untimed", m: "missing", e: "evicted", n: "nodump" };
  var explain = {
    untimed: "entered; not every rank's entry time is known",
    missing: "never entered (missing)",
    evicted: "no longer in this rank's flight recorder",
    nodump: "no dump from this rank"
  };
  function colour(f) {
    f = Math.max(0, Math.min(1, f));
    return "hsl(" + (55 - 55 * f).toFixed(1) + ",90%," + (94 - 58 * f).toFixed(1) + "%)";
  }
  function ms(ns) { return (ns / 1e6).toFixed(3) + " ms"; }
  data.comms.forEach(function (c) {
    var box = document.getElementById(c.heatmapId);
    if (!box) return;
    var n = c.seqs.length;
    var width = Math.max(3, Math.min(14, Math.floor(1100 / Math.max(1, n))));
    box.style.gridTemplateColumns = "auto repeat(" + n + "," + width + "px)";
    var scale = c.maxLateNs > 0 ? c.maxLateNs : 1;
    var frag = document.createDocumentFragment();
    for (var r = 0; r < c.nranks; r++) {
      var label = document.createElement("div");
      label.className = "rowlabel";
      label.textContent = "rank " + r;
      frag.appendChild(label);
      for (var i = 0; i < n; i++) {
        var st = stateNames[c.states[r].charAt(i)] || "untimed";
        var cell = document.createElement("div");
        cell.className = "cell";
        cell.setAttribute("data-rank", r);
        cell.setAttribute("data-seq", c.seqs[i]);
        cell.setAttribute("data-state", st);
        var head = "rank " + r + ", seq " + c.seqs[i] + " " + c.colls[i] + ": ";
        var late = c.late[r][i];
        if (st === "timed" && late !== null) {
          cell.setAttribute("data-late-ns", late);
          cell.style.background = colour(late / scale);
          cell.title = head + ms(late) + " late" + (c.lastRanks[i] === r ? " (last)" : "");
        } else {
          cell.setAttribute("data-late-ns", "");
          cell.title = head + explain[st];
        }
        frag.appendChild(cell);
      }
    }
    box.appendChild(frag);
    var bar = document.getElementById(c.legendBarId);
    if (bar) {
      var stops = [];
      for (var k = 0; k <= 10; k++) stops.push(colour(k / 10));
      bar.style.background = "linear-gradient(to right," + stops.join(",") + ")";
    }
  });
  document.body.setAttribute("data-rendered", "1");
})();
</script>
</body>
</html>
)LOOMHTML";

}  // namespace loom::tracetool
