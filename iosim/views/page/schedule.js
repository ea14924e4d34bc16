// iosim schedule pages: one or several traced schedules stepped event by event.
// An event is 9 integers: op (1 load, 2 store, 3 alloc, 4 free, 5 init), array, r0, nr, c0, nc, words,
// resident words after the event, tile handle.
const LOAD = 1, STORE = 2, ALLOC = 3, FREE = 4, INIT = 5;
const OPNAME = ["", "load", "store", "alloc", "free", "init"];
const OUTLINE = ["", "#0050d0", "#e07000", "#008a2e", "#777", "#c00"];
const READ_RGB = "20, 60, 160", WRITE_RGB = "200, 90, 0";  // shades of reads and of writes per word
const CANVAS_H = Math.round(Math.max(80, Math.min(240, window.innerHeight * 0.16)));  // projector screens: larger

class Schedule {
  constructor(data, index) {
    this.d = data;
    this.n = data.steps.length;
    this.ev = data.events;
    this.A = data.names.length;
    this.index = index;
    this.reset();
    this.heatMax = this.finalHeatMax();  // the most words moved per word of any array, read or written, in the run
    this.scale = this.heatMax;  // the page sets one scale for all its schedules (setScale)
    this.both = this.reads.map((r, a) => r > 0 && this.writes[a] > 0);  // arrays drawn as reads above, writes below
    this.reset();
    this.build();
  }
  reset() {
    this.k = -1;  // the last event applied
    this.reads = new Array(this.A).fill(0);
    this.writes = new Array(this.A).fill(0);
    this.heat = this.d.grids.map(g => new Float64Array(g[0] * g[1]));  // reads per word
    this.wheat = this.d.grids.map(g => new Float64Array(g[0] * g[1]));  // writes per word (initialisation too)
    this.live = new Map();  // handle -> [array, r0, nr, c0, nc, words]
    this.resident = 0;
    this.peak = 0;
  }
  e(k, j) { return this.ev[9 * k + j]; }
  apply(k) {
    const op = this.e(k, 0), a = this.e(k, 1), words = this.e(k, 6), h = this.e(k, 8);
    if (op === LOAD) {
      this.reads[a] += words;
      this.addHeat(this.heat[a], a, this.e(k, 2), this.e(k, 3), this.e(k, 4), this.e(k, 5));
    } else if (op === STORE) {
      this.writes[a] += words;
      this.addHeat(this.wheat[a], a, this.e(k, 2), this.e(k, 3), this.e(k, 4), this.e(k, 5));
    } else if (op === INIT) {  // the whole array, written once
      this.writes[a] += words;
      this.addHeat(this.wheat[a], a, 0, this.d.shapes[a][0], 0, this.d.shapes[a][1]);
    }
    if (op === LOAD || op === ALLOC) {
      this.live.set(h, [a, this.e(k, 2), this.e(k, 3), this.e(k, 4), this.e(k, 5), words]);
      this.resident += words;
    } else if (op === FREE) {
      const t = this.live.get(h);
      if (t) { this.resident -= t[5]; this.live.delete(h); }
    }
    this.peak = Math.max(this.peak, this.resident);
    this.k = k;
  }
  addHeat(H, a, r0, nr, c0, nc) {
    const [gr, gc, fr, fc] = this.d.grids[a];
    for (let i = Math.floor(r0 / fr); i < Math.min(gr, Math.ceil((r0 + nr) / fr)); i++) {
      const rows = Math.min(r0 + nr, (i + 1) * fr) - Math.max(r0, i * fr);
      for (let j = Math.floor(c0 / fc); j < Math.min(gc, Math.ceil((c0 + nc) / fc)); j++) {
        const cols = Math.min(c0 + nc, (j + 1) * fc) - Math.max(c0, j * fc);
        H[i * gc + j] += rows * cols / (fr * fc);  // reads per word, averaged over the cell
      }
    }
  }
  finalHeatMax() {
    for (let k = 0; k < this.n; k++) this.apply(k);
    let mx = 0;
    for (const H of [...this.heat, ...this.wheat]) for (const v of H) mx = Math.max(mx, v);
    return mx;
  }
  seek(k) {
    k = Math.max(-1, Math.min(this.n - 1, k));
    if (k < this.k) this.reset();
    while (this.k < k) this.apply(this.k + 1);
  }
  outerOf(k) {  // the outer iteration holding event k (0-based), by binary search over its starts
    const o = this.d.outer;
    let lo = 0, hi = o.length - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (o[mid] <= k) lo = mid; else hi = mid - 1; }
    return lo;
  }
  state() {  // what the tests read
    const reads = {}, writes = {};
    this.d.names.forEach((n, i) => { reads[n] = this.reads[i]; writes[n] = this.writes[i]; });
    return { k: this.k, n: this.n, reads, writes, resident: this.resident, peak: this.peak, scale: this.scale,
      blocksDone: this.blocksDone === undefined ? null : this.blocksDone,
      gqaTile: this.gqaTile === undefined ? null : this.gqaTile,
      heat: Object.fromEntries(this.d.names.map((n, i) => [n, [Array.from(this.heat[i]), Array.from(this.wheat[i])]])),
      live: [...this.live.values()].map(t => [this.d.names[t[0]], t[5]]) };
  }
  build() {
    const d = this.d;
    this.root = el("section", { class: "panel", id: "schedule" + this.index });
    this.root.append(el("h2", {}, el("span", { text: d.title }), el("span", { class: "note", text: fmt(this.n) + " events" })));
    if (d.problem) {
      this.root.append(el("p", { class: "note", text: "Over the problem " + d.problem + ": this page plays the first of its " +
        fmt(d.thread_blocks) + " thread blocks; the problem's totals are beside the block's counts below." }));
    }
    this.eventLine = el("div", { class: "event" });
    const left = el("div", { class: "left" }), right = el("div", { class: "right" });
    this.root.append(el("div", { class: "body" }, left, right));
    left.append(this.eventLine);
    const arrays = el("div", { class: "arrays" });
    this.canvases = [];
    for (const a of d.slow) {
      const [rows, cols] = d.shapes[a];
      const [gr, gc] = d.grids[a];
      const h = CANVAS_H, w = Math.max(10, Math.min(260, Math.round(h * cols / rows)));
      const c = el("canvas", { width: w, height: h, "data-array": d.names[a] });
      this.canvases.push([a, c]);
      arrays.append(el("figure", {}, c, el("figcaption", {},
        el("span", { class: "swatch", style: "background:" + colour(d.names[a], a) }),
        d.names[a] + " " + rows + "\u00d7" + cols)));
    }
    if (d.blocks) {  // S = Q K^T: the blocks the schedule computes (from the trace); a skipped block stays blank
      const N = d.shapes[d.names.indexOf("Q")][0], nk = d.shapes[d.names.indexOf("K")][0];
      const h = CANVAS_H, w = Math.max(10, Math.min(260, Math.round(h * nk / N)));
      this.blockCanvas = el("canvas", { width: w, height: h, "data-array": "S-blocks" });
      arrays.append(el("figure", {}, this.blockCanvas, el("figcaption", { text: "S = QK\u1d40 blocks computed (" +
        d.blocks.length + "; blank: skipped)" })));
    }
    left.append(arrays);
    this.legend = el("div", { class: "note legend" });
    left.append(this.legend);
    this.fast = el("div", { class: "fast", title: "fast memory: M words" });
    this.occupancy = el("div", { class: "occupancy" });
    left.append(el("h2", { text: "Fast memory (M = " + fmt(d.M) + " words)" }), this.fast, this.occupancy);
    this.table = el("table", { class: "counts" });
    right.append(el("h2", { text: d.problem ? "Words moved (this thread block)" : "Words moved" }), this.table);
    const b = el("ul", { class: "bounds" });
    for (const [name, v] of d.bounds) b.append(el("li", { text: "lower bound " + fmt(v) + " words: " + name }));
    const tot = d.totals;
    const lines = [];
    lines.push((d.problem ? "the whole problem, simulated: " : "simulated total: ") + fmt(tot.reads + tot.writes) +
      " words (reads " + fmt(tot.reads) + ", writes " + fmt(tot.writes) + "), peak " + fmt(tot.peak) + " of M = " + fmt(d.M));
    if (tot.closed_form !== null) lines.push("closed form: " + fmt(tot.closed_form) + " words" +
      (d.exact === true ? " (equal, array by array and in peak)" : d.exact === false ? " (DIFFERENT)" : ""));
    for (const t of lines) right.append(el("div", { class: "occupancy", text: t }));
    right.append(b);
    if (d.gqa) {  // GQA: the key/value head its query heads share, each tile's loads under both policies (gqa.js)
      this.gqa = gqaPanel(d.gqa, this.index);
      this.root.append(this.gqa.root);
    }
  }
  drawBlocks(k) {  // the score blocks computed up to event k, the latest outlined
    const d = this.d, c = this.blockCanvas, ctx = c.getContext("2d");
    const N = d.shapes[d.names.indexOf("Q")][0], nk = d.shapes[d.names.indexOf("K")][0];
    const sx = c.width / nk, sy = c.height / N;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, c.width, c.height);
    let last = null, done = 0;
    ctx.fillStyle = "rgba(" + READ_RGB + ", 0.55)";
    for (const b of d.blocks) {
      if (b[0] > k) break;
      ctx.fillRect(b[3] * sx, b[1] * sy, b[4] * sx, b[2] * sy);
      last = b; done++;
    }
    if (last) { ctx.lineWidth = 3; ctx.strokeStyle = OUTLINE[ALLOC]; ctx.strokeRect(last[3] * sx + 1.5, last[1] * sy + 1.5, Math.max(1, last[4] * sx - 3), Math.max(1, last[2] * sy - 3)); }
    this.blocksDone = done;
  }
  render() {
    const d = this.d, k = this.k;
    this.legend.textContent = "shade: words moved so far per word, one scale for every array" +
      (schedules.length > 1 ? " and schedule" : "") + ": the darkest is " + fmt(this.scale) +
      " per word (the most any word is moved in the run); blue: reads, orange: writes (an array both read and " +
      "written: reads in a cell's upper half, writes in its lower half); outline: this event's tile; dashed: tiles in fast memory";
    // the event line
    if (k < 0) {
      this.eventLine.textContent = "before the first event (press \u2192 or play)";
    } else {
      const op = this.e(k, 0), a = this.e(k, 1), r0 = this.e(k, 2), nr = this.e(k, 3), c0 = this.e(k, 4), nc = this.e(k, 5);
      const where = op === INIT ? d.names[a] + " (all)" : d.names[a] + "[" + r0 + ":" + (r0 + nr) + ", " + c0 + ":" + (c0 + nc) + "]";
      const s = d.steps[k];
      this.eventLine.replaceChildren(
        el("div", { text: "event " + fmt(k + 1) + " of " + fmt(this.n) + " (outer iteration " + (this.outerOf(k) + 1) + " of " +
          d.outer.length + "): " + OPNAME[op] + " " + where + ", " + fmt(this.e(k, 6)) + " words" }),
        el("div", { class: "step", text: s ? "paper step " + s + ": " + d.step_text[String(s)] : "\u00a0" }));
    }
    // the arrays
    const cur = k >= 0 ? [this.e(k, 0), this.e(k, 1), this.e(k, 2), this.e(k, 3), this.e(k, 4), this.e(k, 5)] : null;
    for (const [a, c] of this.canvases) {
      const [rows, cols] = d.shapes[a];
      const [gr, gc, fr, fc] = d.grids[a];
      const ctx = c.getContext("2d");
      const sx = c.width / (gc * fc), sy = c.height / (gr * fr);
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, c.width, c.height);
      const mx = this.scale || 1, split = this.both[a];
      const shade = (H, rgb, half) => {
        for (let i = 0; i < gr; i++) for (let j = 0; j < gc; j++) {
          const v = H[i * gc + j];
          if (v <= 0) continue;
          const t = Math.min(1, v / mx), h = Math.min(fr, rows - i * fr) * sy;
          ctx.fillStyle = "rgba(" + rgb + ", " + (0.08 + 0.87 * t).toFixed(3) + ")";
          const y = i * fr * sy + (half === 2 ? h / 2 : 0);
          ctx.fillRect(j * fc * sx, y, Math.min(fc, cols - j * fc) * sx, half ? h / 2 : h);
        }
      };
      shade(this.heat[a], READ_RGB, split ? 1 : 0);
      shade(this.wheat[a], WRITE_RGB, split ? 2 : 0);
      ctx.setLineDash([3, 2]); ctx.lineWidth = 1; ctx.strokeStyle = "#008a2e";
      for (const t of this.live.values()) if (t[0] === a) ctx.strokeRect(t[3] * sx + 0.5, t[1] * sy + 0.5, Math.max(1, t[4] * sx - 1), Math.max(1, t[2] * sy - 1));
      ctx.setLineDash([]);
      if (cur && cur[1] === a) {
        let [op, , r0, nr, c0, nc] = cur;
        if (op === INIT) { r0 = 0; nr = rows; c0 = 0; nc = cols; }
        ctx.lineWidth = 3; ctx.strokeStyle = OUTLINE[op];
        ctx.strokeRect(c0 * sx + 1.5, r0 * sy + 1.5, Math.max(1, nc * sx - 3), Math.max(1, nr * sy - 3));
      }
    }
    if (this.blockCanvas) this.drawBlocks(k);
    if (this.gqa) this.gqaTile = cur ? this.gqa.light(cur[0], d.names[cur[1]], cur[2], cur[3]) : this.gqa.light(0);
    // fast memory
    const tiles = [];
    let x = 0;
    const hNow = k >= 0 ? this.e(k, 8) : -1;  // the tile of this event, lit in fast memory as on its array
    for (const [h, t] of this.live.entries()) {
      const name = d.names[t[0]], w = 100 * t[5] / d.M;
      const bg = colour(name, t[0]);
      tiles.push(el("div", { class: h === hNow ? "tile current" : "tile", style: "left:" + x + "%;width:" + w + "%;background:" + bg + ";color:" + textOn(bg),
        title: name + "[" + t[1] + ":" + (t[1] + t[2]) + ", " + t[3] + ":" + (t[3] + t[4]) + "] " + t[5] + " words", text: name }));
      x += w;
    }
    tiles.push(el("div", { class: "peakmark", style: "left:calc(" + Math.min(100, 100 * this.peak / d.M) + "% - 1px)", title: "peak so far" }));
    this.fast.replaceChildren(...tiles);
    this.occupancy.textContent = "resident " + fmt(this.resident) + " of M = " + fmt(d.M) + " words (" +
      (100 * this.resident / d.M).toFixed(1) + "%); peak so far " + fmt(this.peak) + " (whole run " + fmt(d.peak) + ")";
    // counters
    const head = el("tr", {}, el("th", { text: "array" }), el("th", { text: "reads" }), el("th", { text: "writes" }),
      el("th", { text: d.problem ? "block's final" : "final (trace)" }), el("th", { text: d.problem ? "problem, simulated" : "closed form" }));
    if (d.problem) head.append(el("th", { text: "problem, closed form" }));
    const rows = [head];
    let R = 0, W = 0, FR = 0, FW = 0;
    for (const name of d.rows) {  // every array of the block and of the problem (split-KV: O, L of the combine)
      const a = d.names.indexOf(name), f = d.final[name] || [0, 0];
      const reads = a < 0 ? 0 : this.reads[a], writes = a < 0 ? 0 : this.writes[a];
      R += reads; W += writes; FR += f[0]; FW += f[1];
      const cf = d.problem ? d.simulated[name] : (d.closed_form || {})[name];
      const done = reads === f[0] && writes === f[1];
      const tr = el("tr", { "data-array": name },
        el("td", {}, el("span", { class: "swatch", style: "background:" + colour(name, a) }), name),
        el("td", { class: done ? "done" : "", text: fmt(reads) }),
        el("td", { class: done ? "done" : "", text: fmt(writes) }),
        el("td", { text: fmt(f[0]) + " / " + fmt(f[1]) }),
        el("td", { text: cf ? fmt(cf[0]) + " / " + fmt(cf[1]) : "-" }));
      if (d.problem) { const c = (d.closed_form || {})[name]; tr.append(el("td", { text: c ? fmt(c[0]) + " / " + fmt(c[1]) : "-" })); }
      rows.push(tr);
    }
    const sum = (t, i) => Object.values(t || {}).reduce((x, v) => x + v[i], 0);
    const other = d.problem ? d.simulated : d.closed_form;
    const tr = el("tr", { "data-total": "" }, el("td", { text: "total" }), el("td", { text: fmt(R) }), el("td", { text: fmt(W) }),
      el("td", { text: fmt(FR) + " / " + fmt(FW) }), el("td", { text: other ? fmt(sum(other, 0)) + " / " + fmt(sum(other, 1)) : "" }));
    if (d.problem) tr.append(el("td", { text: d.closed_form ? fmt(sum(d.closed_form, 0)) + " / " + fmt(sum(d.closed_form, 1)) : "-" }));
    rows.push(tr);
    this.table.replaceChildren(...rows);
  }
}

// series colours of the chart, each at least 4.5:1 against its white background (its labels are small text)
const CHART_COLOURS = ["#c62828", "#1f5f9f", "#2e7d32", "#6a3d9a", "#a65200", "#6d4c41"];
function chartSVG(c) {
  const W = 720, H = 300, L = 70, R = 130, T = 14, B = 36;
  const all = [];
  for (const pts of Object.values(c.series)) for (const p of pts) all.push(p);
  for (const p of c.lower) if (p[1] > 0) all.push(p);
  for (const p of c.upper || []) if (p[1] > 0) all.push(p);
  const xs = all.map(p => p[0]), ys = all.map(p => p[1]).filter(y => y > 0);
  const x0 = Math.log10(Math.min(...xs)), x1 = Math.log10(Math.max(...xs));
  const y0 = Math.floor(Math.log10(Math.min(...ys))), y1 = Math.ceil(Math.log10(Math.max(...ys)));
  const X = m => L + (W - L - R) * (Math.log10(m) - x0) / (x1 - x0 || 1);
  const Y = v => T + (H - T - B) * (1 - (Math.log10(v) - y0) / (y1 - y0 || 1));
  const s = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", id: "chart" });
  s.append(svg("title", { text: "total words against M (closed forms), N=" + c.N + ", d=" + c.d }));
  for (let e = y0; e <= y1; e++) {
    s.append(svg("line", { x1: L, x2: W - R, y1: Y(10 ** e), y2: Y(10 ** e), stroke: "#eee" }));
    s.append(svg("text", { x: L - 6, y: Y(10 ** e) + 4, "text-anchor": "end", text: "1e" + e }));
  }
  for (let e = Math.ceil(x0); e <= Math.floor(x1); e++) {
    s.append(svg("line", { x1: X(10 ** e), x2: X(10 ** e), y1: T, y2: H - B, stroke: "#eee" }));
    s.append(svg("text", { x: X(10 ** e), y: H - B + 14, "text-anchor": "middle", text: fmt(10 ** e) }));
  }
  s.append(svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", text: "M (words of fast memory, log scale)" }));
  s.append(svg("text", { x: 12, y: (T + H - B) / 2, transform: "rotate(-90 12 " + (T + H - B) / 2 + ")", "text-anchor": "middle", text: "total words moved" }));
  const line = (pts, colr, dash, label, id) => {
    const ok = pts.filter(p => p[1] > 0);
    if (!ok.length) return;
    s.append(svg("polyline", { points: ok.map(p => X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(" "),
      fill: "none", stroke: colr, "stroke-width": 2, "stroke-dasharray": dash || "", "data-series": id }));
    const p = ok[ok.length - 1];
    labels.push([Y(p[1]) + 4, X(p[0]) + 4, colr, label]);
  };
  const labels = [];
  const colours = CHART_COLOURS;
  Object.entries(c.series).forEach(([name, pts], i) => line(pts, colours[i % colours.length], "", name, name));
  line(c.lower, "#000", "5 3", "lower bound", "lower");
  line(c.upper || [], "#595959", "1 3", "Thm 2's count, paper blocks", "upper");
  labels.sort((a, b) => a[0] - b[0]);  // the end labels, pushed apart so none overlaps
  labels.forEach((l, i) => { if (i > 0) l[0] = Math.max(l[0], labels[i - 1][0] + 13); });
  for (const [y, x, colr, label] of labels) s.append(svg("text", { x, y, fill: colr, text: label }));
  for (const [m, label, colr] of [[c.d2, "M = d\u00b2 = " + fmt(c.d2), "#595959"], [c.M, "this page: M = " + fmt(c.M), "#c00000"]]) {
    if (Math.log10(m) < x0 || Math.log10(m) > x1) continue;
    s.append(svg("line", { x1: X(m), x2: X(m), y1: T, y2: H - B, stroke: colr, "stroke-dasharray": "2 2", "data-mark": label }));
    s.append(svg("text", { x: X(m) + 3, y: T + 10 + (m === c.M ? 12 : 0), fill: colr, text: label }));
  }
  return s;
}

class Player {
  constructor(scheds) {
    this.s = scheds;
    this.T = Math.max(...scheds.map(s => s.n));  // ticks: the longest schedule's events
    this.t = 0;  // ticks done: 0 = before any event
    this.speeds = [1, 2, 5, 10, 20, 50, 100, 200, 500];
    this.speed = 3;
    this.timer = null;
    this.build();
  }
  // tick t: every schedule has done the same fraction t / T of its events
  eventAt(s, t) { return Math.round(t * s.n / this.T) - 1; }
  go(t) {
    this.t = Math.max(0, Math.min(this.T, t));
    for (const s of this.s) { s.seek(this.eventAt(s, this.t)); s.render(); }
    this.scrub.value = this.t;
    if (this.race) this.drawRace();
    this.pos.textContent = (this.s.length > 1 ? (100 * this.t / this.T).toFixed(1) + "% of each schedule" :
      "event " + fmt(this.t) + " of " + fmt(this.T));
    setFragment(Object.assign({}, settingKey(), this.s.length > 1 ? { t: this.t } : { k: this.t }));
  }
  drawRace() {
    const total = s => s.reads.reduce((x, y) => x + y, 0) + s.writes.reduce((x, y) => x + y, 0);
    const final = s => Object.values(s.d.final).reduce((x, f) => x + f[0] + f[1], 0);
    const top = Math.max(...this.s.map(final)) || 1;
    this.race.replaceChildren(...this.s.map((s, i) => el("div", { class: "lane", "data-algorithm": s.d.algorithm },
      el("span", { class: "name", text: s.d.algorithm }),
      el("span", { class: "track" },
        el("span", { class: "final", style: "width:" + (100 * final(s) / top) + "%" }),
        el("span", { class: "sofar", style: "width:" + (100 * total(s) / top) + "%;background:" + ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"][i % 4] })),
      el("span", { class: "words", text: fmt(total(s)) + " of " + fmt(final(s)) + " words" }))));
  }
  tickOf(s, e) {  // the first tick at which schedule s has done event e
    let t = Math.max(0, Math.floor((e + 0.5) * this.T / s.n));
    while (t < this.T && this.eventAt(s, t) < e) t++;
    return t;
  }
  outer(dir) {  // to the next (or the last) tick at which some schedule ends an outer iteration (fast memory empty)
    const ticks = new Set([0, this.T]);
    for (const s of this.s) {
      for (const x of s.d.outer.slice(1)) ticks.add(this.tickOf(s, x - 1));
      ticks.add(this.tickOf(s, s.n - 1));
    }
    const sorted = [...ticks].sort((a, b) => a - b);
    const target = dir > 0 ? sorted.find(t => t > this.t) ?? this.T : sorted.filter(t => t < this.t).pop() ?? 0;
    this.go(target);
  }
  play(on) {
    if (on === undefined) on = this.timer === null;
    if (this.timer) { clearInterval(this.timer); this.timer = null; }
    if (on) {
      if (this.t >= this.T) this.go(0);
      const per = this.speeds[this.speed];
      const every = Math.max(16, 1000 / per), step = Math.max(1, Math.round(per * every / 1000));
      this.timer = setInterval(() => { if (this.t >= this.T) this.play(false); else this.go(this.t + step); }, every);
    }
    this.playBtn.textContent = this.timer ? "\u2016 pause" : "\u25b6 play";
  }
  setSpeed(i) {
    this.speed = Math.max(0, Math.min(this.speeds.length - 1, i));
    this.speedSel.value = this.speed;
    if (this.timer) this.play(true);
  }
  build() {
    const b = (text, title, fn, id) => { const e = el("button", { text, title, id }); e.addEventListener("click", fn); return e; };
    this.playBtn = b("\u25b6 play", "play / pause (space)", () => this.play(), "play");
    this.speedSel = el("select", { id: "speed", title: "events per second (+ / -)" });
    this.speeds.forEach((v, i) => this.speedSel.append(el("option", { value: i, text: v + " ev/s" })));
    this.speedSel.value = this.speed;
    this.speedSel.addEventListener("change", () => this.setSpeed(+this.speedSel.value));
    this.scrub = el("input", { type: "range", min: 0, max: this.T, value: 0, id: "scrub", "aria-label": "position" });
    this.scrub.addEventListener("input", () => this.go(+this.scrub.value));
    this.pos = el("span", { class: "pos", id: "pos" });
    const bar = el("div", { class: "controls" },
      b("|\u25c0", "to the start (Home)", () => this.go(0), "start"),
      b("\u00ab outer", "one outer iteration back (shift+\u2190, PageUp)", () => this.outer(-1), "outer-back"),
      b("\u2039 1", "one event back (\u2190)", () => this.go(this.t - 1), "back"),
      this.playBtn,
      b("1 \u203a", "one event forward (\u2192)", () => this.go(this.t + 1), "forward"),
      b("outer \u00bb", "one outer iteration forward (shift+\u2192, PageDown)", () => this.outer(1), "outer-forward"),
      b("\u25b6|", "to the end (End)", () => this.go(this.T), "end"),
      this.speedSel, this.scrub, this.pos);
    document.getElementById("main").append(bar);
    if (this.s.length > 1) {  // words moved so far, every schedule on one scale
      this.race = el("div", { class: "race", id: "race" });
      document.getElementById("main").append(this.race);
    }
    const panels = el("div", { class: this.s.length > 1 ? "panels" : "panels one" });
    for (const s of this.s) panels.append(s.root);
    document.getElementById("main").append(panels);
  }
  key(e) {  // the page's keys (one listener for the page calls the player of the setting shown)
    if (e.target && (e.target.tagName === "INPUT" && e.target.type !== "range" || e.target.tagName === "SELECT")) return;
    let done = true;
    if (e.key === " ") this.play();
    else if (e.key === "ArrowRight" && e.shiftKey || e.key === "PageDown") this.outer(1);
    else if (e.key === "ArrowLeft" && e.shiftKey || e.key === "PageUp") this.outer(-1);
    else if (e.key === "ArrowRight") this.go(this.t + 1);
    else if (e.key === "ArrowLeft") this.go(this.t - 1);
    else if (e.key === "Home") this.go(0);
    else if (e.key === "End") this.go(this.T);
    else if (e.key === "+" || e.key === "=") this.setSpeed(this.speed + 1);
    else if (e.key === "-") this.setSpeed(this.speed - 1);
    else done = false;
    if (done) e.preventDefault();
  }
}

// The argument on the page: the lecture "why FlashAttention reads Theta(N^2 d^2 / M)" walked step by step with the
// numbers of the setting shown, every one read from the trace (tile sizes, the working set at the peak, how often
// each K_j is loaded, K's total) or from the chart's closed forms (the crossover), and the lesson's questions,
// whose answers the page checks against the same trace.
function traceFacts(s) {
  const d = s.d, ev = d.events, n = d.steps.length, id = name => d.names.indexOf(name);
  const q = id("Q"), k = id("K");
  if (q < 0 || k < 0) return null;
  const f = { N: d.shapes[q][0], d: d.shapes[q][1], M: d.M, Br: 0, Bc: 0, qRows: new Set(), kLoads: new Map(), kWords: 0,
    peak: 0, peakAt: 0, firstOuterEnd: d.outer.length > 1 ? d.outer[1] : n };
  const live = new Map();
  let atPeak = [];
  for (let i = 0; i < n; i++) {
    const op = ev[9 * i], a = ev[9 * i + 1], r0 = ev[9 * i + 2], nr = ev[9 * i + 3], w = ev[9 * i + 6], h = ev[9 * i + 8];
    if (op === LOAD && a === q) { if (!f.Br) f.Br = nr; f.qRows.add(r0); }
    if (op === LOAD && a === k) { if (!f.Bc) f.Bc = nr; f.kLoads.set(r0, (f.kLoads.get(r0) || 0) + 1); f.kWords += w; }
    if (op === LOAD || op === ALLOC) live.set(h, [d.names[a], w]); else if (op === FREE) live.delete(h);
    if (ev[9 * i + 7] > f.peak) { f.peak = ev[9 * i + 7]; f.peakAt = i; atPeak = [...live.values()]; }
  }
  f.atPeak = atPeak;
  f.Tr = f.qRows.size;
  const counts = [...f.kLoads.values()];
  f.kMin = Math.min(...counts); f.kMax = Math.max(...counts); f.k1 = f.kLoads.get(0) || 0;
  return f;
}
function crossover(chart, name) {  // the smallest M of the chart at which `name` moves fewer words than standard and square tiling
  if (!chart || !chart.series[name]) return null;
  const at = (series, m) => { const p = (series || []).find(x => x[0] === m); return p ? p[1] : null; };
  for (const [m, v] of chart.series[name]) {
    const others = ["standard", "square-tiling"].map(o => at(chart.series[o], m)).filter(x => x !== null);
    if (others.length === 2 && others.every(o => v < o)) return m;
  }
  return null;
}
function narration(set, scheds) {
  const i = scheds.findIndex(s => s.d.algorithm === "flash2" || s.d.algorithm === "flash1");
  if (i < 0 || scheds[i].d.pass !== "forward") return null;
  const s = scheds[i], f = traceFacts(s);
  if (!f) return null;
  const alg = s.d.algorithm, N = f.N, dd = f.d, M = f.M;
  const cross = crossover(set.chart, alg), d2 = dd * dd;
  const tiles = f.atPeak.map(([n, w]) => n + " " + fmt(w)).join(", ");
  const steps = [
    ["What fits in M", "At its peak (event " + fmt(f.peakAt + 1) + ") fast memory holds " + tiles + ": " + fmt(f.peak) +
      " of M = " + fmt(M) + " words. The row block Q_i and its output O_i (Br \u00d7 d each), the column blocks K_j and V_j " +
      "(Bc \u00d7 d each) and the score tile S_ij (Br \u00d7 Bc) must all fit at once.", f.peakAt + 1],
    ["Why Br \u2248 M/(4d)", "Four tiles of d columns share M, so a block has about M/(4d) = " + (M / (4 * dd)).toFixed(1) +
      " rows (S_ij and the row statistics take the rest). This trace's blocks: Br = " + f.Br + ", Bc = " + f.Bc + ".", 1],
    ["How often each K_j is read", alg === "flash2" ?
      "Every row block streams all of K: Tr = \u2308N/Br\u2309 = \u2308" + N + "/" + f.Br + "\u2309 = " + f.Tr +
      " row blocks, and the trace loads each K_j " + (f.kMin === f.kMax ? f.kMin : f.kMin + " to " + f.kMax) + " times." :
      "FlashAttention (Algorithm 1) keeps K_j for a whole column block and streams Q past it: each K_j is loaded " +
      (f.kMin === f.kMax ? f.kMin : f.kMin + " to " + f.kMax) + " time(s), and Q, O, l, m make the round trips instead.",
      f.firstOuterEnd],
    ["The total against Tr\u00b7N\u00b7d", "K is read " + fmt(f.kWords) + " words in all; Tr\u00b7N\u00b7d = " + f.Tr + " \u00b7 " +
      N + " \u00b7 " + dd + " = " + fmt(f.Tr * N * dd) + (f.kWords === f.Tr * N * dd ? " (equal)." : ".") +
      " With Br \u2248 M/(4d) that is about 4N\u00b2d\u00b2/M = " + fmt(4 * N * N * dd * dd / M) +
      " words: K and V are read about 4Nd/M = " + (4 * N * dd / M).toFixed(2) + " times each, hence \u0398(N\u00b2d\u00b2/M).", s.n],
    ["The crossover at M = d\u00b2", "Standard attention moves \u0398(Nd + N\u00b2) words and square tiling \u0398(N\u00b2d/\u221aM); " +
      "N\u00b2d\u00b2/M is the smaller once M \u2265 d\u00b2 = " + fmt(d2) + ". " + (cross === null ? "On this chart " + alg +
      " never moves the fewest words of the three." : "On this page's chart (closed forms) " + alg +
      " first moves fewer words than both at M = " + fmt(cross) + " (" + (cross / d2).toFixed(2) + " d\u00b2)."), s.n],
  ];
  const box = el("section", { class: "panel narration", id: "narration" });
  box.append(el("h2", { text: "The argument, with this setting's numbers (" + alg + ", N = " + N + ", d = " + dd + ", M = " + fmt(M) + ")" }));
  const text = el("div", { class: "story", id: "story" });
  let at = 0;
  const show = j => {
    at = Math.max(0, Math.min(steps.length - 1, j));
    const [head, body, tick] = steps[at];
    text.replaceChildren(el("h3", { text: (at + 1) + " of " + steps.length + ". " + head }), el("p", { text: body }));
    if (player) player.go(Math.round(tick * player.T / s.n));
  };
  const b = (label, id, fn) => { const e = el("button", { text: label, id }); e.addEventListener("click", fn); return e; };
  box.append(el("div", { class: "controls story-controls" }, b("\u2039 previous", "story-back", () => show(at - 1)),
    b("next \u203a", "story-next", () => show(at + 1))), text);
  box.append(questions(alg, f, cross));
  text.append(el("p", { class: "note", text: "Press \u201cnext\u201d to walk the argument; the player moves to the moment each step speaks of." }));
  box.iosimSteps = steps.map(x => x[1]);
  window.iosimStory = { steps: () => steps.map(x => [x[0], x[1]]), show: j => { show(j); return text.textContent; }, facts: f, crossover: cross };
  return box;
}
function questions(alg, f, cross) {
  const qs = [
    ["tr", "How many row blocks Q_i does " + alg + " use here (Tr)?", f.Tr],
    ["k1", "How many times is K_1, the first column block, loaded?", f.k1],
    ["kwords", "How many words of K are read in all?", f.kWords],
  ];
  if (cross !== null) qs.push(["cross", "From the chart: the smallest M at which " + alg + " moves fewer words than standard attention and square tiling?", cross]);
  const box = el("div", { class: "questions" }, el("h3", { text: "Questions (answers checked against this trace)" }));
  for (const [id, ask, answer] of qs) {
    const input = el("input", { type: "text", inputmode: "numeric", id: "answer-" + id, "aria-label": ask, size: 8 });
    const out = el("span", { class: "verdict", id: "verdict-" + id });
    const check = () => {
      const v = parseInt(input.value.replace(/[,\s]/g, ""), 10);
      if (!Number.isFinite(v)) { out.textContent = "type a whole number"; out.className = "verdict bad"; return; }
      const ok = v === answer;
      out.textContent = ok ? "right: the trace says " + fmt(answer) : "not yet: " + fmt(v) + " is too " + (v > answer ? "high" : "low");
      out.className = "verdict " + (ok ? "good" : "bad");
    };
    const btn = el("button", { text: "check", id: "check-" + id });
    btn.addEventListener("click", check);
    input.addEventListener("keydown", e => { if (e.key === "Enter") check(); });
    box.append(el("div", { class: "question" }, el("label", { for: "answer-" + id, text: ask + " " }), input, btn, out));
  }
  return box;
}

document.getElementById("help").textContent = "keys: space play/pause \u00b7 \u2190 \u2192 one event \u00b7 shift+\u2190 \u2192 (or PageUp/PageDown) one outer iteration \u00b7 Home/End \u00b7 + \u2212 speed";

// A page of one setting (PAGE.schedules) or of a grid of settings (PAGE.grid: the real traces of every N, d, M and
// mask it holds, picked with the controls above the player; every number follows the setting picked).
const GRID = PAGE.grid || null;
const GRID_AXES = ["N", "d", "M", "mask"];
let schedules = [], player = null, current = null;
function settingKey() { return GRID && current ? { N: current.N, d: current.d, M: current.M, mask: current.mask } : {}; }
function findSetting(want) { return GRID.settings.find(x => GRID_AXES.every(a => String(x[a]) === String(want[a]))); }
function start(set, t) {
  const main = document.getElementById("main");
  if (player) player.play(false);
  main.replaceChildren();
  current = set;
  schedules = []; player = null;
  if (GRID) drawSettings();
  if (set.refused) {  // a setting iosim refuses: its one line, never a blank page
    main.append(el("p", { class: "verdict bad", id: "refused", text: "N = " + set.N + ", d = " + set.d + ", M = " + set.M +
      ": " + set.refused }));
    setFragment(settingKey());
    return;
  }
  schedules = set.schedules.map((d, i) => new Schedule(d, i));
  const scale = Math.max(1, ...schedules.map(s => s.heatMax));  // one shading scale for every array of every schedule
  for (const s of schedules) s.scale = scale;
  player = new Player(schedules);
  if (set.chart) {
    const c = set.chart;
    main.append(el("section", { class: "panel chart" },
      el("h2", { text: "Total words against M, every algorithm from its closed form (" + (c.backward ? "backward" : "forward") +
        ", N = " + fmt(c.N) + ", d = " + c.d + "; at " + c.lower.length + " values of M, computed when this page was built)" }), chartSVG(c)));
  }
  const story = narration(set, schedules);
  if (story) main.append(story);
  player.go(t || 0);
}
function drawSettings() {
  let bar = document.getElementById("settings");
  if (!bar) {
    bar = el("nav", { id: "settings", class: "controls settings" });
    document.getElementById("main").before(bar);
  }
  const pick = [];
  for (const a of GRID_AXES) {
    const values = GRID.axes[a];
    if (values.length < 2 && a === "mask") continue;
    const sel = el("select", { id: "set-" + a, "aria-label": a });
    values.forEach(v => sel.append(el("option", { value: v, text: a + " = " + v })));
    sel.value = current[a];
    sel.addEventListener("change", () => start(findSetting(Object.assign(settingKey(), { [a]: sel.value })) || current));
    pick.push(sel);
  }
  bar.replaceChildren(el("span", { text: "setting (each one a real trace):" }), ...pick);
}
function fromFragment() {
  const f = fragment();
  const many = (current && current.schedules ? current.schedules : PAGE.schedules || GRID.settings.find(x => x.schedules).schedules).length > 1;
  const v = parseInt(many ? f.t : f.k, 10), t = Number.isFinite(v) ? v : 0;
  if (!GRID && !current) { start(PAGE, t); return; }  // the first start reads the fragment before writing it
  if (GRID) {
    const base = current ? settingKey() : { N: GRID.axes.N[0], d: GRID.axes.d[0], M: GRID.axes.M[0], mask: GRID.axes.mask[0] };
    const asked = Object.fromEntries(GRID_AXES.filter(a => f[a] !== undefined).map(a => [a, f[a]]));
    const set = findSetting(Object.assign(base, asked)) || current || GRID.settings.find(x => !x.refused) || GRID.settings[0];
    if (set !== current) { start(set, t); return; }
  }
  if (player) player.go(t);
}
document.addEventListener("keydown", e => { if (player) player.key(e); });
window.addEventListener("hashchange", () => fromFragment());
fromFragment();
window.iosimPage = {
  go: t => player.go(t), ticks: () => player.T, tick: () => player.t,
  state: () => schedules.map(s => s.state()),
  seekEvent: (i, k) => { const s = schedules[i]; s.seek(k); return s.state(); },
  setting: want => { const set = findSetting(Object.assign(settingKey(), want)); if (set) start(set); return settingKey(); },
  refused: () => (current && current.refused) || null,
};
