// iosim exercise page: a student's numba.cuda kernel's traffic (counted under the CUDA simulator) against the lower
// bound and iosim's schedule, array by array, with the verdict.
function exercisePage() {
  const x = PAGE, main = document.getElementById("main");
  main.replaceChildren();
  const verdict = x.passed ? "passed: correct, and no more words than iosim's schedule" :
    !x.correct ? "not yet: the output differs from NumPy's" :
    "not yet: correct, but it moves " + fmt(x.total) + " words where iosim's schedule moves " + fmt(x.schedule_total);
  main.append(el("h2", { text: x.title + " (" + x.file + "; " + Object.entries(x.sizes).map(([k, v]) => k + " = " + v).join(", ") + ")" }),
    el("p", { class: "verdict " + (x.passed ? "good" : "bad"), id: "verdict", text: verdict }));
  const t = el("table", { class: "counts", id: "traffic" });
  t.append(el("tr", {}, ...["array", "your kernel: reads / writes", "iosim's schedule", "lower bound"].map(h => el("th", { text: h }))));
  const rw = v => fmt(v[0]) + " / " + fmt(v[1]);
  for (const a of Object.keys(x.kernel)) t.append(el("tr", { "data-array": a }, el("td", { text: a }), el("td", { text: rw(x.kernel[a]) }),
    el("td", { text: rw(x.schedule[a]) }), el("td", { text: rw(x.bound[a]) })));
  t.append(el("tr", {}, el("td", { text: "total" }), el("td", { text: fmt(x.total) }), el("td", { text: fmt(x.schedule_total) }),
    el("td", { text: fmt(x.bound_total) })));
  main.append(t, el("p", { class: "note", text: "lower bound: " + x.how }));
  const top = Math.max(x.total, x.schedule_total, x.bound_total) || 1;
  const bars = el("div", { class: "race" });
  for (const [label, v, colr] of [["your kernel", x.total, "#1f5f9f"], ["iosim's schedule", x.schedule_total, "#2e7d32"], ["lower bound", x.bound_total, "#595959"]]) {
    bars.append(el("div", { class: "lane" }, el("span", { text: label }),
      el("span", { class: "track" }, el("span", { class: "sofar", style: "width:" + (100 * v / top) + "%;background:" + colr })),
      el("span", { text: fmt(v) + " words" })));
  }
  main.append(bars);
}
document.getElementById("help").textContent = "every number is counted from the kernel's own loads and stores (numba.cuda under the CUDA simulator)";
exercisePage();
