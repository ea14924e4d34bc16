"""One loop nest per algorithm: FlashAttention's one-head runs are the B = H = 1 case of the nests that run whole
problems (algorithms/flash.py), and on one head they make exactly the papers' loads, stores and on-chip tiles, in
the papers' order.

The expected event lists below are written from the papers' pseudo-code (FlashAttention Algorithm 1 and Algorithm 4,
FlashAttention-2's forward and Algorithm 2), independently of iosim's nests: the test compares every event of a
traced run (operation, array and region) with them, on a ragged grid, without a mask and under the causal mask.
"""

from __future__ import annotations

import inspect

import pytest
from iosim.algorithms import flash

import iosim


def _blocks(n, b):
    return [(k * b, min(b, n - k * b)) for k in range(-(-n // b))]


def _sees(causal, r0, br, c0, bc):
    """Whether the tile rows [r0, r0 + br) x keys [c0, c0 + bc) has an allowed entry (causal: key <= row)."""
    return not causal or c0 <= r0 + br - 1


def _flash1_forward(N, d, Br, Bc, causal):  # noqa: N803
    """Algorithm 1 (with Algorithm 5's skip of a zero block), one head, the paper policy."""
    ev = [("init", "O", 0, N, 0, d), ("init", "l", 0, N, 0, 1), ("init", "m", 0, N, 0, 1)]  # step 2
    for c0, bc in _blocks(N, Bc):  # step 5
        ev += [("load", "K", c0, bc, 0, d), ("load", "V", c0, bc, 0, d)]  # step 6
        for r0, br in _blocks(N, Br):  # step 7
            if not _sees(causal, r0, br, c0, bc):
                continue
            tiles = [("Q", r0, br, 0, d), ("O", r0, br, 0, d), ("l", r0, br, 0, 1), ("m", r0, br, 0, 1)]
            ev += [("load", *t) for t in tiles]  # step 8
            ev.append(("alloc", "S", r0, br, c0, bc))  # step 9
            ev += [("store", *t) for t in tiles[1:]]  # steps 12-13
            ev += [("free", "S", r0, br, c0, bc)] + [("free", *t) for t in tiles]
        ev += [("free", "K", c0, bc, 0, d), ("free", "V", c0, bc, 0, d)]
    return ev


def _flash2_forward(N, d, Br, Bc, causal):  # noqa: N803
    """FlashAttention-2's forward, one head: Q_i outer, O_i, l_i, m_i on chip, O_i and L_i written once."""
    ev = []
    for r0, br in _blocks(N, Br):
        ev += [("load", "Q", r0, br, 0, d), ("alloc", "O", r0, br, 0, d)]
        ev += [("alloc", "L", r0, br, 0, 1), ("alloc", "m", r0, br, 0, 1)]
        for c0, bc in _blocks(N, Bc):
            if not _sees(causal, r0, br, c0, bc):
                continue
            ev += [("load", "K", c0, bc, 0, d), ("load", "V", c0, bc, 0, d), ("alloc", "S", r0, br, c0, bc)]
            ev += [("free", "S", r0, br, c0, bc), ("free", "K", c0, bc, 0, d), ("free", "V", c0, bc, 0, d)]
        ev += [("store", "O", r0, br, 0, d), ("store", "L", r0, br, 0, 1), ("free", "Q", r0, br, 0, d)]
        ev += [("free", "O", r0, br, 0, d), ("free", "L", r0, br, 0, 1), ("free", "m", r0, br, 0, 1)]
    return ev


def _backward(N, d, Br, Bc, causal, alg1):  # noqa: N803
    """Algorithm 4 (alg1) or FlashAttention-2's Algorithm 2, one head: K_j, V_j outer, dQ_i read-modify-written."""
    ev = [("init", "dQ", 0, N, 0, d)]
    if alg1:  # Algorithm 4, step 6
        ev += [("init", "dK", 0, N, 0, d), ("init", "dV", 0, N, 0, d)]
    else:  # FlashAttention-2, step 4: D = rowsum(dO o O) in a pass of its own
        for r0, br in _blocks(N, Br):
            ev += [("load", "dO", r0, br, 0, d), ("load", "O", r0, br, 0, d), ("alloc", "D", r0, br, 0, 1)]
            ev += [("store", "D", r0, br, 0, 1)]
            ev += [("free", "dO", r0, br, 0, d), ("free", "O", r0, br, 0, d), ("free", "D", r0, br, 0, 1)]
    for c0, bc in _blocks(N, Bc):
        kv = [("K", c0, bc, 0, d), ("V", c0, bc, 0, d)]
        grads = [("dK", c0, bc, 0, d), ("dV", c0, bc, 0, d)]
        ev += [("load", *t) for t in kv] + [("alloc", *t) for t in grads]
        for r0, br in _blocks(N, Br):
            if not _sees(causal, r0, br, c0, bc):
                continue
            if alg1:
                rows = [("Q", r0, br, 0, d), ("O", r0, br, 0, d), ("dO", r0, br, 0, d), ("dQ", r0, br, 0, d)]
                rows += [("l", r0, br, 0, 1), ("m", r0, br, 0, 1)]
                scratch = [("S", r0, br, c0, bc), ("dP", r0, br, c0, bc), ("D", r0, br, 0, 1)]
                ev += [("load", *t) for t in rows] + [("alloc", *t) for t in scratch]
                ev += [("store", "dQ", r0, br, 0, d)] + [("free", *t) for t in scratch + rows]
            else:
                rows = [("Q", r0, br, 0, d), ("dO", r0, br, 0, d), ("dQ", r0, br, 0, d)]
                rows += [("L", r0, br, 0, 1), ("D", r0, br, 0, 1)]
                scratch = [("S", r0, br, c0, bc), ("dP", r0, br, c0, bc)]
                ev += [("load", *t) for t in rows] + [("alloc", *t) for t in scratch]
                ev += [("store", "dQ", r0, br, 0, d)] + [("free", *t) for t in scratch + rows]
        ev += [("store", *t) for t in grads] + [("free", *t) for t in kv + grads]
    return ev


PAPER = {
    ("flash1", False): lambda N, d, Br, Bc, causal: _flash1_forward(N, d, Br, Bc, causal),
    ("flash2", False): lambda N, d, Br, Bc, causal: _flash2_forward(N, d, Br, Bc, causal),
    ("flash1", True): lambda N, d, Br, Bc, causal: _backward(N, d, Br, Bc, causal, True),
    ("flash2", True): lambda N, d, Br, Bc, causal: _backward(N, d, Br, Bc, causal, False),
}


@pytest.mark.parametrize("algorithm", ["flash1", "flash2"])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("N", "d", "Br", "Bc"), [(1, 1, 1, 1), (7, 3, 2, 3), (13, 2, 5, 4), (9, 4, 16, 16)])
def test_one_head_makes_the_papers_events_in_order(algorithm, backward, causal, N, d, Br, Bc):  # noqa: N803
    r = iosim.run(
        iosim.Schedule(algorithm, Br=Br, Bc=Bc), N=N, d=d, M=10**5, causal=causal, backward=backward, trace=True
    )
    got = [(e["op"], e["array"], e["r0"], e["nr"], e["c0"], e["nc"]) for e in r.trace.records()]
    br, bc = min(Br, N), min(Bc, N)
    assert got == PAPER[(algorithm, backward)](N, d, br, bc, causal)


def test_each_algorithm_is_one_loop_nest():
    """The one-head functions hold no loop of their own: each calls its problem driver, whose nest is the only one."""
    for one_head, problem in [
        (flash.flash1_forward, "flash1_problem"),
        (flash.flash2_forward, "flash2_problem"),
        (flash.flash1_backward, "flash1_backward_problem"),
        (flash.flash2_backward, "flash2_backward_problem"),
    ]:
        src = inspect.getsource(one_head)
        body = src.split('"""')[-1]  # the code after the docstring
        assert f"{problem}(" in body and "for " not in body and "while " not in body
    nests = [
        name
        for name, f in vars(flash).items()
        if hasattr(f, "py_func") and "for b in range(B)" in inspect.getsource(f.py_func)  # a loop over the batch
    ]
    assert sorted(nests) == ["_backward", "_flash1_forward", "_flash2_forward"]
