// iosim schedule pages: GQA's shared K/V (iosim.views.shared_kv). Key/value head 0 drawn with the g query heads
// that read it, each K_j tile's loads under per-head and packed GQA (one chip per load, coloured by the query heads
// that read it), the words, and the sentences built with the counts. Every number here is one of the page data's
// counts (from the runs' traces); nothing is computed from a formula in the page.
const HEAD_COLOURS = ["#1f5f9f", "#c62828", "#2e7d32", "#6a3d9a", "#a65200", "#00796b", "#ad1457", "#5d4037"];
const GQA_TILES_DRAWN = 32;  // tiles drawn one by one (the totals count every tile)
const GQA_CHIPS = 12;  // chips drawn per set of readers of one tile (more: "+n")
const GQA_POLICIES = ["per-head", "packed"];
function headColour(h) { return HEAD_COLOURS[h % HEAD_COLOURS.length]; }
function headsLabel(heads, g) {
  if (heads.length === 0) return "none";
  if (heads.length <= 3) return heads.map(h => "h" + h).join("+");
  if (heads.length === g) return "all " + g;
  return "h" + heads[0] + "\u2013h" + heads[heads.length - 1];
}
function chip(heads, g) {
  const cols = heads.length ? heads.map(headColour) : ["#9e9e9e"];
  const bg = cols.length === 1 ? "background:" + cols[0] : "background-color:" + cols[0] +  // behind the stripes
    ";background-image:linear-gradient(90deg," + cols.map((c, i) => c + " " + (100 * i / cols.length) + "% " + (100 * (i + 1) / cols.length) + "%").join(",") + ")";
  const fg = cols.every(c => textOn(c) === "#ffffff") ? "#ffffff" : "#000000";
  return el("span", { class: "chip", style: bg + ";color:" + fg + (fg === "#ffffff" && cols.length > 1 ? ";text-shadow:0 0 2px #000" : ""), "data-heads": heads.join(","),
    title: heads.length ? "a load read by query head" + (heads.length > 1 ? "s " : " ") + heads.join(", ") : "a load no query head read",
    text: headsLabel(heads, g) });
}
function loadChips(tile, g) {  // one chip per load, grouped by the query heads that read it
  const box = el("span", { class: "chips", "data-loads": tile[2] });
  for (const [heads, n] of tile[4]) {
    for (let i = 0; i < Math.min(n, GQA_CHIPS); i++) box.append(chip(heads, g));
    if (n > GQA_CHIPS) box.append(el("span", { class: "note", title: "more loads than chips drawn: the count is left of the chips", text: "\u2026" }));
  }
  return box;
}
function gqaPicture(g, tiles) {  // the group's query heads, each joined to the one K/V head they share
  const shown = Math.min(g.g, 16), n = Math.min(tiles.length, GQA_TILES_DRAWN);
  const W = 640, rowH = 22, H = Math.max(shown * rowH, n * 16) + 40, kvX = 250, kvW = 90;
  const pic = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", id: "gqa-picture",
    "aria-label": "query heads 0 to " + (g.g - 1) + " share key/value head 0" });
  const top = 24, tileH = (H - top - 10) / n;
  pic.append(svg("text", { x: 4, y: 14, text: "query heads (Q rows)" }), svg("text", { x: kvX, y: 14, text: "K/V head 0, its tiles" }));
  for (let h = 0; h < shown; h++) {
    const y = top + h * (H - top - 10) / shown, hh = Math.min(rowH - 4, (H - top - 10) / shown - 3);
    const c = headColour(h);
    pic.append(svg("line", { x1: 120, y1: y + hh / 2, x2: kvX, y2: top + (H - top - 10) / 2, stroke: c, "stroke-width": 1.5 }));
    pic.append(svg("rect", { x: 4, y, width: 116, height: hh, fill: c, "fill-opacity": 0.12, stroke: c, "stroke-width": 2, "data-head": h }));
    pic.append(svg("text", { x: 10, y: y + hh / 2 + 4, fill: "#1b1b1b", text: "query head " + h + (h === shown - 1 && shown < g.g ? " \u2026" : "") }));
  }
  for (let j = 0; j < n; j++) {
    const y = top + j * tileH, name = "K_" + (j + 1) + "/V_" + (j + 1);
    pic.append(svg("rect", { x: kvX, y, width: kvW, height: Math.max(1, tileH - 1), fill: "#2ca02c", "fill-opacity": 0.25 + 0.5 * (j % 2), stroke: "#1b5e20", "data-tile": j }));
    if (tileH >= 11) {
      pic.append(svg("text", { x: kvX + 4, y: y + tileH / 2 + 4, text: name }));
      const cells = GQA_POLICIES.filter(p => g.policies[p]).map(p => {
        const t = (g.policies[p].tiles.K || []).find(x => x[0] === tiles[j][0] && x[1] === tiles[j][1]);
        return p + " \u00d7" + (t ? fmt(t[2]) : "0");
      });
      pic.append(svg("text", { x: kvX + kvW + 6, y: y + tileH / 2 + 4, text: "loaded " + cells.join(", ") }));
    }
  }
  return pic;
}
function gqaTable(g, tiles) {
  const pols = GQA_POLICIES.filter(p => g.policies[p]);
  const head = el("tr", {}, el("th", { text: "tile" }), ...pols.map(p => el("th", { text: p + (p === g.own ? " (this page's run)" : "") + ": loads of K_j, by the query heads that read each" })),
    ...pols.map(p => el("th", { text: p + ": words of K_j and V_j" })));
  const rows = [head], byTile = [];
  tiles.slice(0, GQA_TILES_DRAWN).forEach((tile, j) => {
    const tr = el("tr", { "data-tile": j, "data-rows": tile[0] + ":" + (tile[0] + tile[1]) },
      el("td", { text: "K_" + (j + 1) + ", V_" + (j + 1) + " (keys " + tile[0] + "\u2013" + (tile[0] + tile[1] - 1) + ")" }));
    const words = [];
    for (const p of pols) {
      const own = (g.policies[p].tiles.K || []).find(x => x[0] === tile[0] && x[1] === tile[1]);
      tr.append(el("td", { class: "loads", "data-policy": p }, own ? el("span", { class: "count", text: fmt(own[2]) + " \u00d7 " }) : "-", own ? loadChips(own, g.g) : ""));
      words.push(el("td", { "data-policy": p, text: own ? fmt(own[5]) : "-" }));
    }
    tr.append(...words);
    rows.push(tr); byTile.push(tr);
  });
  const sumRow = (label, key) => el("tr", { "data-sum": key }, el("td", { text: label }), ...pols.map(() => el("td", {})),
    ...pols.map(p => el("td", { "data-policy": p, text: fmt(g.policies[p][key]) })));
  rows.push(sumRow("K and V of key/value head 0", "group_total"));
  rows.push(sumRow("K and V over the problem (the run's counts)", "total"));
  const table = el("table", { class: "counts gqa-table" }, ...rows);
  return [el("div", { class: "scroll" }, table), byTile];
}
function gqaPanel(g, index) {
  const tiles = g.policies[g.own].tiles.K || [];
  const root = el("div", { class: "gqa", id: "gqa" + index });
  root.append(el("h2", { text: "Shared K/V (GQA): key/value head 0, read by query heads 0\u2013" + (g.g - 1) + " (g = " + g.g + ")" }));
  root.append(gqaPicture(g, tiles));
  const [table, byTile] = gqaTable(g, tiles);
  root.append(table);
  if (tiles.length > GQA_TILES_DRAWN) root.append(el("p", { class: "note", text: "the first " + GQA_TILES_DRAWN + " of " + fmt(tiles.length) + " tiles drawn; the sums count every tile" }));
  const story = el("div", { class: "story gqa-text" });
  for (const t of g.text) story.append(el("p", { text: t }));
  if (g.saving) story.append(el("p", { class: "saving", "data-words": g.saving.words, text: "Saving of packed over per-head, K and V over the problem: " + fmt(g.saving.words) + " words (" + g.saving.percent + "%)." }));
  root.append(story);
  let lit = null;
  const light = (op, name, r0, nr) => {  // the tile this event loads, lit in the table (K/V head 0's rows only)
    if (lit) lit.classList.remove("current");
    lit = null;
    if (op !== LOAD || (name !== "K" && name !== "V")) return null;
    const j = tiles.findIndex(x => x[0] === r0 && x[1] === nr);
    if (j < 0 || j >= byTile.length) return null;
    lit = byTile[j]; lit.classList.add("current");
    return j;
  };
  return { root, light };
}
