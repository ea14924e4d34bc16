// iosim pebble page: the red-blue pebble game (Hong & Kung 1981) with the rules of iosim.pebble.game.Game.
const TITLES = { R1: "R1 (read)", R2: "R2 (write)", R3: "R3 (compute)", R4: "R4 (remove)" };

class IllegalMove extends Error {
  constructor(rule, vertex, reason, step) {
    super("illegal move " + step + ": " + TITLES[rule] + " on " + vertex + ": " + reason);
    this.rule = rule; this.vertex = vertex; this.reason = reason; this.step = step;
  }
}

// The game's rules: the same as iosim.pebble.game.Game (strict capacity), move for move and message for message.
class PebbleGame {
  constructor(g, M) {
    this.g = g; this.M = M;
    this.isInput = new Set(g.inputs);
    this.red = new Set(); this.blue = new Set(g.inputs);
    this.reads = 0; this.writes = 0; this.computes = 0; this.steps = 0; this.peak = 0;
  }
  illegal(rule, v, reason) { return new IllegalMove(rule, this.g.names[v], reason, this.steps + 1); }
  placeRed(rule, v) {
    if (this.red.has(v)) return;
    if (this.M !== null && this.red.size >= this.M)
      throw this.illegal(rule, v, "all M=" + this.M + " red pebbles are in use (remove one first, R4)");
    this.red.add(v);
    this.peak = Math.max(this.peak, this.red.size);
  }
  move(rule, v) {
    const g = this.g;
    if (rule === "R1") {
      if (!this.blue.has(v)) throw this.illegal(rule, v, "it has no blue pebble (not in slow memory)");
      this.placeRed(rule, v);
      this.reads += 1;
    } else if (rule === "R2") {
      if (!this.red.has(v)) throw this.illegal(rule, v, "it has no red pebble (not in fast memory)");
      this.blue.add(v);
      this.writes += 1;
    } else if (rule === "R3") {
      if (this.isInput.has(v)) throw this.illegal(rule, v, "it is an input: inputs enter fast memory only by R1");
      const missing = g.parents[v].filter(p => !this.red.has(p)).map(p => g.names[p]);
      if (missing.length) {
        const shown = missing.slice(0, 4).join(", ") + (missing.length > 4 ? ", ..." : "");
        throw this.illegal(rule, v, "parent" + (missing.length > 1 ? "s" : "") + " " + shown + " not red");
      }
      this.placeRed(rule, v);
      this.computes += 1;
    } else if (rule === "R4") {
      if (!this.red.has(v)) throw this.illegal(rule, v, "it has no red pebble to remove");
      this.red.delete(v);
    } else {
      throw new Error("a rule is one of R1, R2, R3, R4");
    }
    this.steps += 1;
  }
  missing() { return this.g.outputs.filter(v => !this.blue.has(v)).map(v => this.g.names[v]); }
  outcome() {
    const missing = this.missing();
    return { legal: true, moves: this.steps, reads: this.reads, writes: this.writes, io: this.reads + this.writes,
      computes: this.computes, peak: this.peak, complete: missing.length === 0, missing };
  }
}

// A move list (pairs [rule, vertex name]) played from the start: the verdict the tests compare with Python's.
function replay(g, M, moves) {
  const index = new Map(g.names.map((n, i) => [n, i]));
  const game = new PebbleGame(g, M);
  for (const [rule, name] of moves) {
    if (!index.has(name)) return { legal: false, error: "no vertex " + name };
    try { game.move(rule, index.get(name)); } catch (e) {
      if (!(e instanceof IllegalMove)) throw e;
      return { legal: false, step: e.step, rule: e.rule, vertex: e.vertex, reason: e.reason, message: e.message };
    }
  }
  return game.outcome();
}

class Board {
  constructor() {
    this.games = PAGE.games;
    const main = document.getElementById("main");
    this.pick = el("select", { id: "graph" });
    this.games.forEach((g, i) => this.pick.append(el("option", { value: i, text: g.graph + ", M = " + g.M +
      (g.solution ? " (exercise " + g.solution.file + ")" : "") })));
    this.pick.addEventListener("change", () => this.load(+this.pick.value));
    const b = (text, title, fn, id) => { const e = el("button", { text, title, id }); e.addEventListener("click", fn); return e; };
    this.controls = el("div", { class: "controls" }, this.pick,
      b("R1 read", "red pebble on a blue vertex (key 1)", () => this.play("R1"), "R1"),
      b("R2 write", "blue pebble on a red vertex (key 2)", () => this.play("R2"), "R2"),
      b("R3 compute", "red pebble on a vertex whose parents are red (key 3)", () => this.play("R3"), "R3"),
      b("R4 remove", "take a red pebble off (key 4)", () => this.play("R4"), "R4"),
      b("undo", "take back the last move (u)", () => this.undo(), "undo"),
      b("restart", "start again", () => this.restart(), "restart"),
      b("exercise's solution", "play the solution file of docs/pebble", () => this.playList("solution"), "solution"),
      b("iosim's best", "play iosim's optimum (or greedy schedule where the search is out of reach)", () => this.playList("best"), "best"),
      b("best: next move", "iosim's best schedule one move at a time (n)", () => this.stepBest(), "best-step"));
    this.status = el("div", { class: "occupancy", id: "status" });
    this.verdict = el("div", { class: "verdict", id: "verdict" });
    this.svg = svg("svg", { id: "board" });
    this.log = el("div", { class: "moves", id: "log" });
    this.info = el("div", { class: "note", id: "info" });
    main.append(this.controls, el("div", { class: "game" },
      el("div", {}, this.svg, el("div", { class: "note", text: "click a vertex (or Tab to it and press Enter), then a rule (keys 1-4). Red fill: red pebble (fast memory); blue ring: blue pebble (slow memory); dashed: an output. Inputs at the bottom." })),
      el("div", {}, el("h2", { text: "Game" }), this.status, this.verdict, this.info, el("h2", { text: "Moves" }), this.log)));
    document.addEventListener("keydown", e => {
      const r = { "1": "R1", "2": "R2", "3": "R3", "4": "R4" }[e.key];
      if (r) { this.play(r); e.preventDefault(); } else if (e.key === "u") { this.undo(); e.preventDefault(); }
      else if (e.key === "n") { this.stepBest(); e.preventDefault(); }
    });
    const f = fragment();
    this.load(Math.max(0, Math.min(this.games.length - 1, parseInt(f.g || "0", 10) || 0)));
  }
  load(i) {
    this.i = i; this.g = this.games[i]; this.pick.value = i;
    this.sel = null;
    this.restart();
    setFragment({ g: i });
  }
  restart() { this.moves = []; this.game = new PebbleGame(this.g, this.g.M); this.message = ""; this.bad = false; this.draw(); }
  play(rule) {
    if (this.sel === null) { this.message = "pick a vertex first (click it)"; this.bad = true; this.draw(); return; }
    try {
      this.game.move(rule, this.sel);
      this.moves.push([rule, this.g.names[this.sel]]);
      this.message = ""; this.bad = false;
    } catch (e) {
      if (!(e instanceof IllegalMove)) throw e;
      this.message = e.message + " (refused: the game is as it was)"; this.bad = true;
    }
    this.draw();
  }
  undo() {
    const moves = this.moves.slice(0, -1);
    this.restart();
    for (const [r, n] of moves) { this.game.move(r, this.g.names.indexOf(n)); this.moves.push([r, n]); }
    this.draw();
  }
  playList(which) {
    const src = which === "best" ? this.g.best : this.g.solution;
    if (!src) { this.message = "this graph has no exercise solution"; this.bad = true; this.draw(); return; }
    this.restart();
    const v = replay(this.g, this.g.M, src.moves);
    const idx = new Map(this.g.names.map((n, i) => [n, i]));
    for (const [r, n] of src.moves) {
      try { this.game.move(r, idx.get(n)); this.moves.push([r, n]); } catch (e) { break; }
    }
    this.message = which === "best" ? "iosim's " + src.how + ": " + fmt(src.io) + " I/O" :
      "the exercise's solution " + src.file + ": " + (v.legal ? fmt(v.io) + " I/O" : v.message);
    this.bad = !v.legal;
    this.draw();
  }
  stepBest() {  // the next move of iosim's best schedule, from the start unless the moves so far are its beginning
    const best = this.g.best.moves;
    const prefix = this.moves.length < best.length && this.moves.every((m, i) => m[0] === best[i][0] && m[1] === best[i][1]);
    if (!prefix) this.restart();
    const [r, n] = best[this.moves.length];
    const v = this.g.names.indexOf(n);
    this.sel = v;
    this.game.move(r, v);
    this.moves.push([r, n]);
    this.message = "iosim's " + this.g.best.how.split(" (")[0] + ", move " + this.moves.length + " of " + best.length + ": " +
      TITLES[r] + " on " + n + (this.moves.length === best.length ? "; done, " + fmt(this.g.best.io) + " I/O" : "");
    this.bad = false;
    this.draw();
  }
  draw() {
    const g = this.g, game = this.game;
    const W = 900, H = 520, pad = 24;
    const X = p => pad + (W - 2 * pad) * p[0], Y = p => pad + (H - 2 * pad) * p[1];
    this.svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    const kids = [];
    g.parents.forEach((ps, v) => { for (const p of ps) kids.push(svg("line", { class: "edge", x1: X(g.pos[p]), y1: Y(g.pos[p]), x2: X(g.pos[v]), y2: Y(g.pos[v]) })); });
    const outs = new Set(g.outputs);
    const r = Math.max(5, Math.min(14, 300 / g.names.length + 4));
    g.names.forEach((name, v) => {
      const cls = ["v", game.red.has(v) ? "red" : "", this.sel === v ? "sel" : "", outs.has(v) ? "output" : ""].join(" ");
      const node = svg("g", { class: cls, "data-v": v, "data-name": name, tabindex: 0, role: "button", focusable: "true",
        "aria-label": name + (game.red.has(v) ? ", red" : "") + (game.blue.has(v) ? ", blue" : "") + (this.sel === v ? ", selected" : "") },
        svg("title", { text: name + (game.red.has(v) ? ", red" : "") + (game.blue.has(v) ? ", blue" : "") }),
        svg("circle", { class: "body", cx: X(g.pos[v]), cy: Y(g.pos[v]), r }));
      if (game.blue.has(v)) node.append(svg("circle", { class: "blue", cx: X(g.pos[v]), cy: Y(g.pos[v]), r: r + 3 }));
      if (g.names.length <= 40) node.append(svg("text", { class: "lab", x: X(g.pos[v]), y: Y(g.pos[v]) + r + 9, "text-anchor": "middle", text: name }));
      node.addEventListener("click", () => { this.sel = v; this.draw(); });
      node.addEventListener("keydown", e => {  // keyboard play: Tab to a vertex, Enter or space selects it
        if (e.key === "Enter" || e.key === " ") { this.sel = v; this.draw(); e.preventDefault(); }
      });
      kids.push(node);
    });
    const focused = document.activeElement && document.activeElement.getAttribute ? document.activeElement.getAttribute("data-v") : null;
    this.svg.replaceChildren(...kids);
    if (focused !== null) {  // the redrawn vertex keeps the keyboard focus
      const again = this.svg.querySelector('g[data-v="' + focused + '"]');
      if (again) again.focus();
    }
    const o = game.outcome();
    this.status.textContent = "graph " + g.graph + " (" + g.names.length + " vertices), M = " + g.M + " red pebbles; moves " +
      o.moves + "; I/O " + o.io + " (R1 reads " + o.reads + ", R2 writes " + o.writes + "); R3 computes " + o.computes +
      "; red in use " + game.red.size + " of " + g.M + ", peak " + o.peak + "; outputs blue " +
      (g.outputs.length - o.missing.length) + " of " + g.outputs.length + (this.sel !== null ? "; selected " + g.names[this.sel] : "");
    this.verdict.textContent = this.message || (o.complete ? "every output is blue: the game is won with I/O " + o.io : "");
    this.verdict.className = "verdict " + (this.bad ? "bad" : o.complete ? "good" : "");
    this.info.textContent = "iosim's best for this graph: " + g.best.how + ", " + g.best.io + " I/O" +
      (g.solution ? "; the exercise's solution file: " + g.solution.file : "");
    this.log.textContent = this.moves.map((m, i) => (i + 1) + ". " + m[0] + " " + m[1]).join("\n");
    this.log.scrollTop = this.log.scrollHeight;
  }
}

document.getElementById("help").textContent = "click a vertex (or Tab to it, Enter), then 1 R1 read \u00b7 2 R2 write \u00b7 3 R3 compute \u00b7 4 R4 remove \u00b7 u undo \u00b7 n iosim's next move";
const board = new Board();
window.iosimPebble = {
  replay: (i, moves) => replay(PAGE.games[i], PAGE.games[i].M, moves),
  board,
};
