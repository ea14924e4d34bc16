// iosim teaching pages: shared helpers (iosim's own code, no third-party script).
"use strict";
const PALETTE = { Q: "#1f77b4", K: "#2ca02c", V: "#9467bd", O: "#d62728", S: "#ff7f0e", P: "#e377c2",
  L: "#8c564b", l: "#8c564b", m: "#7f7f7f", D: "#bcbd22", dO: "#17becf", dQ: "#393b79", dK: "#637939",
  dV: "#843c39", dS: "#e7969c", dP: "#7b4173", Opart: "#ad494a", Lpart: "#8c6d31" };
const EXTRA = ["#3182bd", "#31a354", "#756bb1", "#e6550d", "#636363", "#6baed6", "#fd8d3c", "#74c476"];
function colour(name, i) { return PALETTE[name] || EXTRA[i % EXTRA.length]; }
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}
function svg(tag, attrs, ...kids) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}
function fmt(n) { return Math.round(n).toLocaleString("en-US"); }
function fragment() {
  const out = {};
  for (const part of window.location.hash.replace(/^#/, "").split("&")) {
    const [k, v] = part.split("=");
    if (k) out[k] = decodeURIComponent(v || "");
  }
  return out;
}
function setFragment(obj) {
  const text = "#" + Object.entries(obj).map(([k, v]) => k + "=" + encodeURIComponent(v)).join("&");
  if (window.location.hash !== text) history.replaceState(null, "", text);
}
document.getElementById("version").textContent = PAGE.version;
