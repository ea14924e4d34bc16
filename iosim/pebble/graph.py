"""Computation graphs (DAGs) for the red-blue pebble game, in the papers' convention (docs/theory-replay.md).

A :class:`Graph` is a list of vertices, each with a name (``Q[0,1]``, ``S[2,3]``, ``prod(S[2,3],k=1)``), an op
label and its parents; it knows its inputs (the vertices without parents that start blue) and its outputs (the
vertices that must end blue). Vertices are numbered in a topological order (parents first).

Builders, standard (non-fast) matrix multiplication throughout, as Hong & Kung and Saha & Ye count it:

* :func:`matmul` ``(m, k, n)``: C = A B. Each entry C[i,j] is the root of its own summation tree over the k
  products ``prod(C[i,j],k=l)`` = A[i,l] B[l,j]; the trees are disjoint; the summation order is a chain (the papers
  leave it arbitrary). With k = 1 the product is the root itself.
* :func:`attention` ``(N, d, stable)``: Saha & Ye's graph. Level 1 is QK^T (N^2 d products and N^2 summation
  trees, roots S[i,j]); then A[i,j] = exp(S[i,j]), the row sums D[i] (a summation tree over j), the reciprocal
  Dinv[i], the second product layer U = A V (N^2 d products, N d trees) and the final scaling O[i,k] =
  U[i,k] Dinv[i]. ``stable=True`` is the form FlashAttention computes: the row maximum m[i] (a max chain over j)
  and A[i,j] = exp(S[i,j] - m[i]) (one vertex with parents S[i,j] and m[i]).
* :func:`attention_backward` ``(N, d)``: the backward in FlashAttention-2's form (inputs Q, K, V, O, dO and the
  row logsumexp L): S = QK^T recomputed, P[i,j] = exp(S[i,j] - L[i]), dV = P^T dO, dP = dO V^T,
  D[i] = rowsum(dO o O), dS[i,j] = P[i,j] (dP[i,j] - D[i]), dQ = dS K, dK = dS^T Q; every product a layer of
  product vertices and summation trees. Outputs dQ, dK, dV.

The softmax scale 1/sqrt(d) is left out, as in Saha & Ye (it is one unary vertex per score and changes no I/O
argument). :func:`named` parses ``matmul:2x2x2``, ``attention:4x2``, ``attention-stable:4x2``,
``attention-backward:2x1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from iosim.base.errors import InputError

MAX_VERTICES = 200_000  # a named graph larger than this is refused (the game itself has no limit)


@dataclass
class Graph:
    """A computation DAG: ``names[v]``, ``ops[v]`` and ``parents[v]`` for vertex v = 0 .. n-1 (parents first)."""

    name: str
    names: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    parents: list[tuple[int, ...]] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, op: str, parents: tuple[int, ...] = ()) -> int:
        """Add a vertex (its parents must exist); returns its number. Op "input" marks an input."""
        if name in self.index:
            raise ValueError(f"vertex {name} defined twice in graph {self.name}")
        v = len(self.names)
        self.names.append(name)
        self.ops.append(op)
        self.parents.append(tuple(parents))
        self.index[name] = v
        return v

    def __len__(self) -> int:
        return len(self.names)

    @property
    def inputs(self) -> list[int]:
        return [v for v, op in enumerate(self.ops) if op == "input"]

    def is_input(self, v: int) -> bool:
        return self.ops[v] == "input"

    def vertex(self, name: str) -> int:
        """The vertex called ``name``; InputError naming the graph when there is none."""
        if not isinstance(name, str):
            raise InputError("vertex", f"must be a vertex name of graph {self.name} (e.g. {self.names[0]})", name)
        v = self.index.get(name.strip())
        if v is None:
            raise InputError("vertex", f"must be a vertex of graph {self.name} (e.g. {self.names[0]})", name)
        return v

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.names]
        for v, ps in enumerate(self.parents):
            for p in ps:
                out[p].append(v)
        return out

    def edges(self) -> int:
        return sum(len(ps) for ps in self.parents)

    def summary(self) -> str:
        n_in, n_out = len(self.inputs), len(self.outputs)
        outs = f"{n_out} output{'s' if n_out != 1 else ''}"
        return f"graph {self.name}: {len(self)} vertices ({n_in} inputs, {outs}), {self.edges()} edges"


def _inputs(g: Graph, X: str, rows: int, cols: int) -> list[list[int]]:
    return [[g.add(f"{X}[{r},{c}]", "input") for c in range(cols)] for r in range(rows)]


def _tree(g: Graph, root: str, op: str, leaves: list[int]) -> int:
    """A summation (or max) chain over ``leaves`` whose last vertex is named ``root``; one leaf is its own root."""
    if len(leaves) == 1:
        return leaves[0]
    acc = leaves[0]
    for t, leaf in enumerate(leaves[1:], start=2):
        name = root if t == len(leaves) else f"{op}({root},{t})"
        acc = g.add(name, op, (acc, leaf))
    return acc


def _product(g: Graph, C: str, A, B, m: int, k: int, n: int) -> list[list[int]]:
    """The standard product C = A B as product vertices and one summation tree per entry; A(i, l), B(l, j) give
    the vertices of the operands. Returns C's roots (named C[i,j]; with k = 1 the product vertex is the root)."""
    roots = []
    for i in range(m):
        row = []
        for j in range(n):
            if k == 1:
                row.append(g.add(f"{C}[{i},{j}]", "mul", (A(i, 0), B(0, j))))
                continue
            prods = [g.add(f"prod({C}[{i},{j}],k={l})", "mul", (A(i, l), B(l, j))) for l in range(k)]
            row.append(_tree(g, f"{C}[{i},{j}]", "add", prods))
        roots.append(row)
    return roots


def _check_size(what: str, **sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(name, f"of a {what} graph must be a positive integer", value)


def matmul(m: int, k: int, n: int) -> Graph:
    """C = A B with A m x k and B k x n: mk + kn inputs, mkn products, mn summation trees (outputs C[i,j])."""
    _check_size("matmul", m=m, k=k, n=n)
    g = Graph(f"matmul:{m}x{k}x{n}")
    A, B = _inputs(g, "A", m, k), _inputs(g, "B", k, n)
    C = _product(g, "C", lambda i, l: A[i][l], lambda l, j: B[l][j], m, k, n)
    g.outputs = [v for row in C for v in row]
    return g


def attention(N: int, d: int, stable: bool = False) -> Graph:  # noqa: N803
    """Saha & Ye's attention graph O = D^-1 exp(QK^T) V (``stable``: with the row max, as FlashAttention)."""
    _check_size("attention", N=N, d=d)
    g = Graph(f"attention{'-stable' if stable else ''}:{N}x{d}")
    Q, K, V = _inputs(g, "Q", N, d), _inputs(g, "K", N, d), _inputs(g, "V", N, d)
    S = _product(g, "S", lambda i, l: Q[i][l], lambda l, j: K[j][l], N, d, N)  # level 1: QK^T
    A = []
    for i in range(N):
        if stable:
            m_i = _tree(g, f"m[{i}]", "max", S[i])
            if N == 1:  # a one-element max is the element itself: give the row max its own vertex
                m_i = g.add(f"m[{i}]", "max", (S[i][0],))
            A.append([g.add(f"A[{i},{j}]", "exp-sub", (S[i][j], m_i)) for j in range(N)])
        else:
            A.append([g.add(f"A[{i},{j}]", "exp", (S[i][j],)) for j in range(N)])
    Dinv = []
    for i in range(N):
        D_i = _tree(g, f"D[{i}]", "add", A[i])
        Dinv.append(g.add(f"Dinv[{i}]", "recip", (D_i,)))
    U = _product(g, "U", lambda i, j: A[i][j], lambda j, c: V[j][c], N, N, d)
    g.outputs = [g.add(f"O[{i},{c}]", "mul", (U[i][c], Dinv[i])) for i in range(N) for c in range(d)]
    return g


def attention_backward(N: int, d: int) -> Graph:  # noqa: N803
    """The attention backward (FlashAttention-2's form, inputs Q, K, V, O, dO, L); outputs dQ, dK, dV."""
    _check_size("attention-backward", N=N, d=d)
    g = Graph(f"attention-backward:{N}x{d}")
    Q, K, V = _inputs(g, "Q", N, d), _inputs(g, "K", N, d), _inputs(g, "V", N, d)
    O, dO = _inputs(g, "O", N, d), _inputs(g, "dO", N, d)
    L = [g.add(f"L[{i}]", "input") for i in range(N)]
    S = _product(g, "S", lambda i, l: Q[i][l], lambda l, j: K[j][l], N, d, N)
    P = [[g.add(f"P[{i},{j}]", "exp-sub", (S[i][j], L[i])) for j in range(N)] for i in range(N)]
    dV = _product(g, "dV", lambda j, i: P[i][j], lambda i, c: dO[i][c], N, N, d)
    dP = _product(g, "dP", lambda i, c: dO[i][c], lambda c, j: V[j][c], N, d, N)
    D = []
    for i in range(N):
        prods = [g.add(f"prod(D[{i}],k={c})", "mul", (dO[i][c], O[i][c])) for c in range(d)]
        D.append(_tree(g, f"D[{i}]", "add", prods) if d > 1 else prods[0])
    dS = [[g.add(f"dS[{i},{j}]", "dsoftmax", (P[i][j], dP[i][j], D[i])) for j in range(N)] for i in range(N)]
    dQ = _product(g, "dQ", lambda i, j: dS[i][j], lambda j, c: K[j][c], N, N, d)
    dK = _product(g, "dK", lambda j, i: dS[i][j], lambda i, c: Q[i][c], N, N, d)
    g.outputs = [v for X in (dQ, dK, dV) for row in X for v in row]
    return g


BUILDERS = {
    "matmul": (3, lambda s: matmul(*s)),
    "attention": (2, lambda s: attention(*s)),
    "attention-stable": (2, lambda s: attention(*s, stable=True)),
    "attention-backward": (2, lambda s: attention_backward(*s)),
}
SPEC_HELP = "matmul:MxKxN, attention:NxD, attention-stable:NxD or attention-backward:NxD (e.g. matmul:2x2x2)"


def _estimated_vertices(kind: str, s: list[int]) -> int:
    if kind == "matmul":
        m, k, n = s
        return m * k + k * n + 2 * m * k * n
    N, d = s
    return (12 if kind == "attention-backward" else 5) * N * N * d + 8 * N * N + 6 * N * d


def named(spec: str) -> Graph:
    """The graph a name such as ``matmul:2x2x2`` or ``attention:4x2`` stands for (InputError naming ``graph``)."""
    if not isinstance(spec, str):
        raise InputError("graph", f"must be {SPEC_HELP}", spec)
    m = re.fullmatch(r"\s*([a-z-]+):(\d+(?:x\d+)*)\s*", spec)
    if m is None or m.group(1) not in BUILDERS:
        raise InputError("graph", f"must be {SPEC_HELP}", spec)
    kind, sizes = m.group(1), [int(x) for x in m.group(2).split("x")]
    arity, build = BUILDERS[kind]
    if len(sizes) != arity or min(sizes) < 1:
        raise InputError("graph", f"must be {SPEC_HELP} with {arity} positive sizes", spec)
    if _estimated_vertices(kind, sizes) > MAX_VERTICES:
        raise InputError("graph", f"must have at most {MAX_VERTICES} vertices (a game to play by hand)", spec)
    return build(sizes)
