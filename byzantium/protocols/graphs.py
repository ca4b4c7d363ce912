"""Communication graphs for the Byzantine protocols, and their r-robustness.

Definitions (LeBlanc et al., "Resilient asymptotic consensus in robust networks", 2013):
a nonempty node set S is r-reachable when some node of S has at least r neighbours outside S;
G is r-robust when for every pair of nonempty disjoint node sets S1, S2 at least one of them is
r-reachable. With reach(S) = max over i in S of |N(i) minus S|, G is r-robust iff
min over such pairs of max(reach(S1), reach(S2)) >= r, and that minimum is `robustness(G)`.
No graph on n nodes is more than ceil(n/2)-robust. For digraphs N(i) means in-neighbours.

Builders return plain networkx graphs on nodes 0..n-1 (`from_edges` reads an explicit edge list);
algorithms are plain functions of a graph.
"""

import math
import time

import networkx as nx
import numpy as np

# Exact search is O(n 2^n) in numpy; past this size `method="auto"` switches to the MILP.
EXACT_MAX_NODES = 20
# certify() runs the MILP up to this size and gives the proven lower_bound beyond: past it, random
# (Erdos-Renyi) graphs can take the solver minutes or go unsolved, while MERG and preferential graphs
# stay quick (timings: bench/results/code_notes.md). A size rule, not a time limit, so that the same
# graph always gets the same certificate (and the same --f auto); MERG and preferential graphs have
# proofs (experiments/sac.certificate).
MILP_MAX_NODES = 40


# ---------------------------------------------------------------------------------------- builders

def complete(n: int) -> nx.Graph:
    """K_n: ceil(n/2)-robust, the most any n-node graph can be."""
    _check_n(n)
    return _no_loops(nx.complete_graph(n))


def merg(n: int) -> nx.Graph:
    """gamma-MERG (after Lee & Panagou, "Minimal construction of graphs with maximum robustness"):
    gamma = ceil(n/2)-robust with as few edges as possible.

    Odd n = 2g-1: a (g+1)-clique on nodes 0..g plus each remaining node linked to g clique nodes
    (which clique node each one skips rotates, to balance degrees); 3g(g-1)/2 edges (n=7: 18),
    the paper's lower bound for odd n.
    Even n = 2g (our construction): K_n minus the edges inside an independent set of g nodes
    (0..g-1) and minus one more edge (g, g+1); g^2 + g(g-1)/2 - 1 edges for g >= 3 (n=6: 11,
    n=8: 21), K_4 minus an edge for n=4, K_2 for n=2; one edge fewer than adding a node to the
    odd construction. Robustness is verified by the tests for n <= 16; the edge count is the minimum for n=4, 6
    (exhaustive search in the tests) and equals the best that a randomized search found for n=8.
    """
    _check_n(n)
    g = math.ceil(n / 2)
    if n % 2:
        G = nx.complete_graph(min(g + 1, n))
        for k, v in enumerate(range(g + 1, n)):
            G.add_edges_from((v, u) for u in range(g + 1) if u != k % (g + 1))
    elif n <= 4:
        G = nx.complete_graph(n)
        if n == 4:
            G.remove_edge(0, 1)
    else:
        G = nx.complete_graph(n)
        G.remove_edges_from(nx.complete_graph(g).edges())
        G.remove_edge(g, g + 1)
    return _no_loops(G)


def preferential(n: int, r: int) -> nx.Graph:
    """Complete core K_{2r-1} (r-robust) plus each further node tied to r core nodes, which keeps
    the graph r-robust. Core nodes are chosen round-robin so their degrees stay balanced."""
    _check_n(n)
    _check_r(r)
    core = 2 * r - 1
    if n < core:
        raise ValueError(f"preferential(n={n}, r={r}) needs n >= 2r-1 = {core} (the core K_{core})")
    G = nx.complete_graph(core)
    for k, v in enumerate(range(core, n)):
        G.add_edges_from((v, (k * r + j) % core) for j in range(r))
    return _no_loops(G)


def erdos_renyi(n: int, r: int, seed: int, max_tries: int = 100_000, verify: bool = True,
                max_seconds: float = 120.0) -> nx.Graph:
    """G(n, p) with p = (ln n + (r-1) ln ln n)/n, resampled until verified r-robust (certify()).

    Deterministic in `seed` (numpy Generator). Dense targets (r near ceil(n/2)) are rare under
    this p, so many samples may be drawn; a cheap min-degree test (an r-robust graph with r >= 2
    has min degree >= r) rejects most before the check. verify=False: the first sample that passes
    the min-degree test, whatever its robustness (`--f auto` measures it instead). A MILP check can
    take a minute, and past MILP_MAX_NODES only the lower bound certifies, so the search stops after
    max_seconds.
    """
    _check_n(n)
    _check_r(r)
    if r > math.ceil(n / 2):
        raise ValueError(f"no graph on n={n} nodes is {r}-robust (at most ceil(n/2) = {math.ceil(n / 2)})")
    if n == 1:
        return _no_loops(nx.empty_graph(1))
    p = min(1.0, max(0.0, (math.log(n) + (r - 1) * math.log(math.log(n))) / n))
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(n, k=1)
    start = time.perf_counter()
    for tries in range(1, max_tries + 1):
        keep = rng.random(len(iu[0])) < p
        A = np.zeros((n, n), dtype=bool)
        A[iu[0][keep], iu[1][keep]] = True
        A |= A.T
        if r >= 2 and A.sum(1).min() < r:
            continue
        G = nx.from_numpy_array(A.astype(np.int8))
        if not verify or certify(G)["r"] >= r:
            return _no_loops(G)
        if time.perf_counter() - start > max_seconds:
            break
    raise RuntimeError(
        f"erdos_renyi(n={n}, r={r}, seed={seed}): no sample certified {r}-robust in {tries} tries "
        f"(p={p:.3f}); use a denser topology (merg/complete), a smaller r, or --f auto (F from the "
        f"sample's own robustness)")


def from_edges(edges, n: int) -> nx.Graph:
    """The undirected graph on nodes 0..n-1 with exactly these edges ([[u, v], ...]), e.g. the graph of
    another code base. ValueError naming the problem: an entry that is not two integer node ids, a node
    outside 0..n-1, a self-loop, an edge given twice (in either direction), a node with no edge."""
    _check_n(n)
    if not isinstance(edges, (list, tuple)):
        raise ValueError(f"the edges must be a list of [u, v] pairs, got {type(edges).__name__}")
    G = nx.empty_graph(n)
    for k, e in enumerate(edges):
        if not (isinstance(e, (list, tuple)) and len(e) == 2
                and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in e)):
            raise ValueError(f"edge {k}: {e!r} is not a pair of integer node ids [u, v]")
        u, v = int(e[0]), int(e[1])
        if not (0 <= u < n and 0 <= v < n):
            raise ValueError(f"edge {k}: {e!r} names a node outside 0..{n - 1}")
        if u == v:
            raise ValueError(f"edge {k}: {e!r} is a self-loop: a node must not be its own neighbour")
        if G.has_edge(u, v):
            raise ValueError(f"edge {k}: {e!r} is given twice (edges are undirected)")
        G.add_edge(u, v)
    alone = [i for i in G.nodes if G.degree(i) == 0]
    if alone:
        raise ValueError(f"nodes {alone} have no edge: the edges must cover all nodes 0..{n - 1}")
    return G


# -------------------------------------------------------------------------------------- robustness

def robustness(G: nx.Graph, method: str = "auto") -> int:
    """The largest r for which G is r-robust (0 for a disconnected graph).

    method: "exact" (all subset pairs, via a subset DP; n <= 22), "milp" (Usevitch & Panagou),
    or "auto" (exact up to EXACT_MAX_NODES nodes). Graphs with fewer than 2 nodes have no
    subset pair; by convention they get 0.
    """
    return _min_pair(G, method)[0]


def violating_pair(G: nx.Graph, r: int, method: str = "auto"):
    """A pair (S1, S2) of nonempty disjoint node sets, neither r-reachable, or None if G is
    r-robust. This is the certificate to show a user why a topology is refused."""
    _check_r(r)
    value, pair = _min_pair(G, method)
    return pair if pair is not None and value < r else None


def is_r_robust(G: nx.Graph, r: int, method: str = "auto") -> bool:
    _check_r(r)
    return violating_pair(G, r, method) is None


def lower_bound(G: nx.Graph) -> int:
    """A proven lower bound on robustness(G), in milliseconds at any size (undirected graphs).

    Of a disjoint pair, the smaller set S has s <= n/2 nodes, and max(reach(S1), reach(S2)) >= reach(S).
    reach(S) >= d_(s) - (s - 1), d_(s) the s-th smallest degree (S holds a node of degree >= d_(s), and
    at most s - 1 of its neighbours are inside S); and reach(S) >= e(S, not S)/s >= lambda_2 (n - s)/n
    (the max is at least the mean; Fiedler's bound e(S, not S) >= lambda_2 s (n - s)/n with lambda_2 the
    Laplacian's second eigenvalue). So robustness >= min over s of the larger of the two."""
    _check_graph(G)
    if G.is_directed():
        raise ValueError("lower_bound is for undirected graphs")
    n = G.number_of_nodes()
    if n < 2:
        return 0
    A = _adjacency(G, list(G.nodes)).astype(float)
    degrees = np.sort(A.sum(1))
    lam2 = np.linalg.eigvalsh(np.diag(A.sum(1)) - A)[1]
    s = np.arange(1, n // 2 + 1)
    bound = np.maximum(degrees[s - 1] - s + 1, lam2 * (n - s) / n).min()
    return max(0, math.ceil(bound - 1e-6))  # eigenvalues carry rounding: never round a bound up past it


def certify(G: nx.Graph) -> dict:
    """{"r", "check", "exact", "seconds"}: G is at least r-robust, and how that is known.

    check: "exact" (subset search, n <= EXACT_MAX_NODES), "milp" (n <= MILP_MAX_NODES), or "bound"
    (lower_bound(G) beyond: r may be below the true robustness; exact is then False)."""
    start = time.perf_counter()
    n = G.number_of_nodes()
    if n <= EXACT_MAX_NODES:
        r, check = robustness(G, "exact"), "exact"
    elif n <= MILP_MAX_NODES:
        r, check = robustness(G, "milp"), "milp"
    else:
        r, check = lower_bound(G), "bound"
    return {"r": int(r), "check": check, "exact": check != "bound", "seconds": round(time.perf_counter() - start, 3)}


def reach(G: nx.Graph, S) -> int:
    """max over i in S of the number of neighbours of i outside S (S is r-reachable iff >= r)."""
    S = set(S)
    nbrs = G.predecessors if G.is_directed() else G.neighbors
    return max((sum(1 for j in nbrs(i) if j not in S) for i in S), default=0)


def f_local(G: nx.Graph, S, F: int) -> bool:
    """True when the node set S (e.g. the faulty/adversarial agents) is F-local: every node
    outside S has at most F neighbours in S (in-neighbours for a digraph). This is the fault
    model under which an (F+1)-robust graph lets the honest nodes filter F values each."""
    _check_graph(G)
    if F < 0:
        raise ValueError(f"F must be >= 0, got {F}")
    S = set(S)
    unknown = S - set(G.nodes)
    if unknown:
        raise ValueError(f"nodes {sorted(unknown, key=str)} are not in the graph")
    nbrs = G.predecessors if G.is_directed() else G.neighbors
    return all(sum(1 for j in nbrs(i) if j in S) <= F for i in G.nodes if i not in S)


# ------------------------------------------------------------------------------------------- exact

def _min_pair(G, method):
    _check_graph(G)
    n = G.number_of_nodes()
    if n < 2:
        return 0, None
    if method == "auto":
        method = "exact" if n <= EXACT_MAX_NODES else "milp"
    if method == "exact":
        return _exact(G)
    if method == "milp":
        return _milp(G)
    raise ValueError(f"method must be 'auto', 'exact' or 'milp', got {method!r}")


def _exact(G):
    """min over disjoint nonempty (S1, S2) of max(reach(S1), reach(S2)), over all 3^n pairs
    without enumerating them: reach of every subset (2^n), then best[T] = min reach over nonempty
    subsets of T by a sum-over-subsets DP, then min over S1 of max(reach[S1], best[~S1])."""
    nodes = list(G.nodes)
    n = len(nodes)
    if n > 22:
        raise ValueError(f"exact robustness needs O(2^n) memory; n={n} is too large, use method='milp'")
    A = _adjacency(G, nodes)
    full = (1 << n) - 1
    masks = np.arange(1 << n, dtype=np.int64)
    rch = np.zeros(1 << n, dtype=np.int64)
    for i in range(n):
        nb = int(sum(1 << j for j in range(n) if A[i, j]))
        inside = (masks >> i) & 1
        outside_nbrs = int(A[i].sum()) - np.bitwise_count(masks & nb).astype(np.int64)
        rch = np.maximum(rch, np.where(inside == 1, outside_nbrs, 0))
    big = n + 1
    best = np.where(masks == 0, big, rch)
    arg = masks.copy()  # which subset of T attains best[T]
    for i in range(n):
        bit = 1 << i
        has = (masks & bit) != 0
        src = masks[has] ^ bit
        better = best[src] < best[has]
        idx = masks[has][better]
        best[idx] = best[src[better]]
        arg[idx] = arg[src[better]]
    S1 = masks[1:full]  # nonempty and leaving room for S2
    value = np.maximum(rch[S1], best[full ^ S1])
    k = int(np.argmin(value))
    s1, s2 = int(S1[k]), int(arg[full ^ int(S1[k])])
    pair = ({nodes[i] for i in range(n) if s1 >> i & 1}, {nodes[i] for i in range(n) if s2 >> i & 1})
    return int(value[k]), pair


# -------------------------------------------------------------------------------------------- MILP

def _milp(G):
    """Usevitch & Panagou, "Determining r- and (r,s)-robustness of digraphs using mixed integer
    linear programming" (Automatica 2020): with L the (in-)Laplacian and b the indicator of S,
    (L b)_i is |N(i) minus S| for i in S and <= 0 outside S, so max_i (L b)_i = reach(S). Hence
        min t  s.t.  L b1 <= t,  L b2 <= t,  b1 + b2 <= 1,  1'b1 >= 1,  1'b2 >= 1,  b binary
    equals min over pairs of max(reach(S1), reach(S2)), i.e. the robustness. Three cuts that keep that
    optimum and make the solver's work far smaller (bench/results/code_notes.md):
    |S1| <= |S2| (swapping the sets changes nothing), t >= lower_bound(G) (undirected graphs), and
    t <= the smallest in-degree (S1 = that node, S2 = the rest)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    nodes = list(G.nodes)
    n = len(nodes)
    A = _adjacency(G, nodes).astype(float)
    L = np.diag(A.sum(1)) - A
    I, Z, one, zero = np.eye(n), np.zeros((n, n)), np.ones((n, 1)), np.zeros((n, 1))
    row, zrow = np.ones((1, n)), np.zeros((1, n))
    cons = [
        LinearConstraint(np.hstack([L, Z, -one]), -np.inf, 0),    # reach(S1) <= t
        LinearConstraint(np.hstack([Z, L, -one]), -np.inf, 0),    # reach(S2) <= t
        LinearConstraint(np.hstack([I, I, zero]), -np.inf, 1),    # disjoint
        LinearConstraint(np.hstack([row, zrow, [[0]]]), 1, np.inf),  # S1 nonempty
        LinearConstraint(np.hstack([zrow, row, [[0]]]), 1, np.inf),  # S2 nonempty
        LinearConstraint(np.hstack([row, -row, [[0]]]), -np.inf, 0),  # |S1| <= |S2|
    ]
    c = np.zeros(2 * n + 1)
    c[-1] = 1.0
    integrality = np.r_[np.ones(2 * n), 0]
    low = 0 if G.is_directed() else lower_bound(G)
    high = max(1, int(A.sum(1).min()))
    bounds = Bounds(np.r_[np.zeros(2 * n), low], np.r_[np.ones(2 * n), high])
    res = milp(c, constraints=cons, integrality=integrality, bounds=bounds)
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"robustness MILP failed: {res.message}")
    x = np.round(res.x[:-1]).astype(int)
    pair = ({nodes[i] for i in range(n) if x[i]}, {nodes[i] for i in range(n) if x[n + i]})
    return int(round(res.fun)), pair


# ----------------------------------------------------------------------------------------- helpers

def _adjacency(G, nodes):
    """A[i, j] = 1 when nodes[j] is a (in-)neighbour of nodes[i]."""
    A = nx.to_numpy_array(G, nodelist=nodes, weight=None, dtype=np.int64) != 0
    return (A.T if G.is_directed() else A).astype(np.int64)


def _check_graph(G):
    if G.is_multigraph():
        raise ValueError("multigraphs are not supported; pass a simple nx.Graph or nx.DiGraph")
    loops = list(nx.nodes_with_selfloops(G))
    if loops:
        raise ValueError(f"graph has self-loops at {loops}: an agent must not count itself as its own neighbour")


def _check_n(n):
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")


def _check_r(r):
    if not isinstance(r, (int, np.integer)) or r < 1:
        raise ValueError(f"r must be an integer >= 1, got {r!r}")


def _no_loops(G):
    assert nx.number_of_selfloops(G) == 0, "builder produced a self-loop"
    return G
