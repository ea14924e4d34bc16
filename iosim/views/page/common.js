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
// The URL fragment follows the page at most every FRAGMENT_MS: browsers ignore history.replaceState called too
// often (Chromium: about 200 calls in 10 s), which left the fragment behind the page after fast play. A call
// within FRAGMENT_MS of the last update waits, and the newest position is written when the wait ends.
const FRAGMENT_MS = 120;
let fragmentWanted = null, fragmentTimer = null, fragmentLast = 0;
function writeFragment() {
  fragmentTimer = null;
  fragmentLast = Date.now();
  if (fragmentWanted !== null && window.location.hash !== fragmentWanted) history.replaceState(null, "", fragmentWanted);
}
function setFragment(obj) {
  fragmentWanted = "#" + Object.entries(obj).map(([k, v]) => k + "=" + encodeURIComponent(v)).join("&");
  if (fragmentTimer !== null) return;
  const wait = fragmentLast + FRAGMENT_MS - Date.now();
  if (wait <= 0) writeFragment(); else fragmentTimer = setTimeout(writeFragment, wait);
}
// WCAG 2 contrast: relative luminance of an sRGB colour "#rrggbb", and the text colour (near-black or white) that
// reads best on a background (every background then gives at least 4.5:1 with one of the two).
function luminance(hex) {
  const c = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16) / 255)
    .map(v => v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
  return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
}
function contrast(a, b) { const x = luminance(a), y = luminance(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); }
function textOn(bg) { return contrast(bg, "#000000") >= contrast(bg, "#ffffff") ? "#000000" : "#ffffff"; }
document.getElementById("version").textContent = PAGE.version;
