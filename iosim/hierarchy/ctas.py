"""Thread blocks from a schedule's own trace: where a single-head run is cut into pieces (the CTAs' work).

The hierarchy never re-implements a schedule. It runs the single-head schedule once (count-only, with the event
trace of :mod:`iosim.memory_model`) and cuts the trace into **pieces**, one per thread block (CTA):

* **A piece ends where fast memory is empty again**: after every event whose ``resident`` column is 0. Every
  schedule keeps its outer loop's operands resident for the whole inner loop, so the cut falls exactly at the
  outer-loop boundaries:

  - flash2 forward: a piece per row block i (Q_i, O_i, l_i, m_i stay resident over the j loop);
  - flash1 forward: a piece per column block j (K_j, V_j stay resident over the i loop), after the memset's
    initialisations of O, l, m (its ``init`` events); its kernel runs all of a head's pieces in one CTA;
  - flash1 backward: a piece per column block j, after the memset of dQ, dK, dV (one CTA per head, too);
  - flash2 backward: the D_i = rowsum(dO_i o O_i) pieces (one per row block i), then one per column block
    j (dK_j, dV_j, K_j, V_j resident over the i loop), after the memset of dQ;
  - square tiling forward: phase 1, one CTA per row tile i (m_i, l_i resident over its j loop); phase 2, one CTA
    per row tile i (L_i resident over its output tiles); backward: phase 1 one CTA per row tile i, then one CTA per
    output tile of each of the three products dV, dQ, dK;
  - standard attention: one CTA per row block (or output tile) of each of its products and softmax sweeps.

  Events that move nothing (alloc/free only) make no piece. The pieces' loads, stores and initialisations re-add to
  the two-level count exactly (tests/test_hierarchy.py).
* **Launches** are declared, not inferred: :mod:`iosim.hierarchy.launches` names each schedule's kernels and maps
  the pieces onto them (and their CTAs onto a grid: one per piece, or one per head unit).

A piece's **requests** are its loads (reads from L2), stores and initialisations (writes), in trace order; one
request is one tile transfer, ``(write, array, r0, nr, c0, nc, words)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iosim.memory_model.core import INIT, LOAD, STORE

REQ_WIDTH = 7  # write, aid, r0, nr, c0, nc, words
_RES = 7  # the trace's resident-words column


@dataclass(frozen=True)
class Cut:
    """A trace cut into pieces: ``requests`` (one row per request), ``piece_ptr`` (piece p's requests are rows
    piece_ptr[p]:piece_ptr[p+1]) and ``piece_events`` (the trace rows [start, stop) of each piece)."""

    requests: np.ndarray
    piece_ptr: np.ndarray
    piece_events: np.ndarray

    @property
    def pieces(self) -> int:
        return len(self.piece_ptr) - 1


def cut(trace) -> Cut:
    """Cut a trace into pieces (module docstring)."""
    ev = np.asarray(trace.events)
    moves = (ev[:, 0] == LOAD) | (ev[:, 0] == STORE) | (ev[:, 0] == INIT) if len(ev) else np.zeros(0, bool)
    ends = np.flatnonzero(ev[:, _RES] == 0) if len(ev) else np.zeros(0, np.int64)
    if len(ev) and (not len(ends) or ends[-1] != len(ev) - 1):
        ends = np.append(ends, len(ev) - 1)
    requests, ptr, spans = [], [0], []
    start = 0
    for end in ends:
        rows = ev[start : end + 1]
        sel = rows[moves[start : end + 1]]
        if len(sel):
            req = np.empty((len(sel), REQ_WIDTH), np.int64)
            req[:, 0] = sel[:, 0] != LOAD
            req[:, 1:7] = sel[:, 1:7]
            requests.append(req)
            ptr.append(ptr[-1] + len(sel))
            spans.append((start, end + 1))
        start = end + 1
    req = np.concatenate(requests) if requests else np.zeros((0, REQ_WIDTH), np.int64)
    return Cut(
        req,
        np.asarray(ptr, np.int64),
        np.asarray(spans, np.int64).reshape(-1, 2),
    )
