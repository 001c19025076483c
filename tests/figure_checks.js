// Injected by tests/test_report_browser.py into a copy of a report: once plotly has drawn, measure
// every figure (div.js-plotly-plot) as the browser laid it out and write the findings as JSON into
// <pre id="checks">, and post them to the parent page (the test's index of iframes).
//
// Per figure: its rendered size; every SVG text element as the polygon of its four corners on the
// screen (rotated tick labels included), flagged when it pokes out of the figure, out of the plot
// area that clips it (data labels) or overlaps another text; legend scroll bars (a legend taller
// than its room); each subplot's plot area and how many marks it draws that a reader can see
// (bars at least 3 px both ways, markers, lines, heatmap cells), whether a note sits in it and whether
// its markers stand in one column (one x value: bars would read better).
(function () {
  var TOLERANCE = 1.5;  // px a text may cross a border by (antialiasing, rounding)

  function corners(el, inset) {  // inset: px off each side, in the text's own (unrotated) frame
    var box = el.getBBox(), m = el.getScreenCTM();
    if (!m || box.width === 0 || box.height === 0) return null;
    var x0 = box.x + inset, y0 = box.y + inset, x1 = box.x + box.width - inset, y1 = box.y + box.height - inset;
    var pts = [[x0, y0], [x1, y0], [x1, y1], [x0, y1]];
    return pts.map(function (p) { return [m.a * p[0] + m.c * p[1] + m.e, m.b * p[0] + m.d * p[1] + m.f]; });
  }

  function separated(a, b) {  // separating axis test for two convex polygons
    var polys = [a, b];
    for (var k = 0; k < 2; k++) {
      var poly = polys[k];
      for (var i = 0; i < poly.length; i++) {
        var p = poly[i], q = poly[(i + 1) % poly.length], nx = q[1] - p[1], ny = p[0] - q[0];
        var ra = a.map(function (v) { return v[0] * nx + v[1] * ny; });
        var rb = b.map(function (v) { return v[0] * nx + v[1] * ny; });
        if (Math.max.apply(null, ra) <= Math.min.apply(null, rb) ||
            Math.max.apply(null, rb) <= Math.min.apply(null, ra)) return true;
      }
    }
    return false;
  }

  function outside(poly, r) {
    return poly.some(function (p) {
      return p[0] < r.left - TOLERANCE || p[0] > r.right + TOLERANCE || p[1] < r.top - TOLERANCE ||
             p[1] > r.bottom + TOLERANCE;
    });
  }

  function shown(el) {
    for (var e = el; e && e.nodeType === 1; e = e.parentNode) {
      var style = getComputedStyle(e);
      if (style.display === 'none' || style.visibility === 'hidden' || style.opacity === '0') return false;
    }
    return true;
  }

  function plotRect(gd, plot) {  // the plot area of one subplot, on the screen
    var box = gd.getBoundingClientRect();
    var left = box.left + plot.xaxis._offset, top = box.top + plot.yaxis._offset;
    return {left: left, top: top, right: left + plot.xaxis._length, bottom: top + plot.yaxis._length};
  }

  function marks(group) {
    var count = 0;
    group.querySelectorAll('.barlayer .point path, .bars .point path').forEach(function (path) {
      var r = path.getBoundingClientRect();
      if (r.width >= 3 && r.height >= 3) count++;
    });
    group.querySelectorAll('.scatterlayer path.point, .scatterlayer .js-line, .hm image, .heatmaplayer image')
      .forEach(function (el) {
        var r = el.getBoundingClientRect();
        if (r.width > 0 || r.height > 0) count++;
      });
    return count;
  }

  function column(group) {  // three or more markers, no bars, all within 4 px across: a column of dots
    if (group.querySelector('.barlayer .point path')) return false;
    var xs = Array.prototype.map.call(group.querySelectorAll('.scatterlayer path.point'), function (el) {
      var r = el.getBoundingClientRect();
      return r.left + r.width / 2;
    });
    return xs.length >= 3 && Math.max.apply(null, xs) - Math.min.apply(null, xs) < 4;
  }

  function check(gd) {
    var box = gd.getBoundingClientRect(), layout = gd._fullLayout;
    var result = {id: gd.id, width: Math.round(box.width), height: Math.round(box.height), clipped: [],
                  overlaps: [], legend_scroll: false, subplots: []};
    var plots = layout._plots || {};
    var areas = {};
    Object.keys(plots).forEach(function (name) {
      var plot = plots[name];
      if (!plot.xaxis || !plot.yaxis) return;
      areas[name] = plotRect(gd, plot);
      var group = gd.querySelector('.cartesianlayer .subplot.' + name) || gd;
      result.subplots.push({id: name, plot_width: Math.round(plot.xaxis._length),
                            plot_height: Math.round(plot.yaxis._length), marks: marks(group), note: false,
                            column: column(group)});
    });
    var texts = [];
    gd.querySelectorAll('svg.main-svg text').forEach(function (el) {
      if (!el.textContent.trim() || el.closest('.hoverlayer') || !shown(el)) return;
      var poly = corners(el, 0), inner = corners(el, 1);  // texts that only touch do not overlap
      if (!poly) return;
      var bounds = box, clip = el.closest('.barlayer, .scatterlayer'), sub = el.closest('.subplot');
      if (clip && sub) {  // data labels: clipped to their plot area unless cliponaxis is off
        var name = Array.prototype.filter.call(sub.classList, function (c) { return c !== 'subplot'; })[0];
        var trace = el.closest('.trace');
        var clips = !trace || !trace.__data__ || !trace.__data__[0] || !trace.__data__[0].trace ||
                    trace.__data__[0].trace.cliponaxis !== false;
        if (clips && areas[name]) bounds = areas[name];
      }
      var text = el.textContent.trim();
      if (outside(poly, bounds)) result.clipped.push(text);
      texts.push({text: text, poly: inner});
      if (el.closest('.annotation')) {  // a note written inside a subplot
        result.subplots.forEach(function (s) {
          var r = areas[s.id], c = [(poly[0][0] + poly[2][0]) / 2, (poly[0][1] + poly[2][1]) / 2];
          if (c[0] > r.left && c[0] < r.right && c[1] > r.top && c[1] < r.bottom) s.note = true;
        });
      }
    });
    for (var i = 0; i < texts.length; i++) {
      for (var j = i + 1; j < texts.length; j++) {
        if (!separated(texts[i].poly, texts[j].poly)) result.overlaps.push([texts[i].text, texts[j].text]);
      }
    }
    gd.querySelectorAll('.scrollbar').forEach(function (bar) {
      if (parseFloat(bar.getAttribute('height') || '0') > 0 || parseFloat(bar.getAttribute('width') || '0') > 0) {
        result.legend_scroll = true;
      }
    });
    return result;
  }

  function run() {
    var found = [];
    document.querySelectorAll('div.js-plotly-plot').forEach(function (gd) {
      try { found.push(check(gd)); } catch (e) { found.push({id: gd.id, error: String(e)}); }
    });
    var notes = Array.prototype.map.call(document.querySelectorAll('section.note h2'),
                                         function (h) { return h.textContent; });
    var payload = {page: document.title, window: window.innerWidth, figures: found, not_drawn: notes};
    var pre = document.createElement('pre');
    pre.id = 'checks';
    pre.textContent = JSON.stringify(payload);
    document.body.appendChild(pre);
    if (window.parent !== window) window.parent.postMessage(JSON.stringify(payload), '*');
  }

  window.addEventListener('load', function () { setTimeout(run, 1500); });
})();
