import itertools
import math
import random

import networkx as nx
import pytest

from byzantium.protocols.graphs import (complete, erdos_renyi, f_local, from_edges, is_r_robust, merg, preferential,
                                        reach, robustness, violating_pair)


def _brute_force(G):
    """Robustness straight from the definition: every pair of disjoint nonempty sets (3^n)."""
    nodes = list(G.nodes)
    best = len(nodes)
    for assign in itertools.product((0, 1, 2), repeat=len(nodes)):
        S1 = {v for v, a in zip(nodes, assign) if a == 1}
        S2 = {v for v, a in zip(nodes, assign) if a == 2}
        if S1 and S2:
            best = min(best, max(reach(G, S1), reach(G, S2)))
    return best


@pytest.mark.parametrize("n", range(2, 11))
def test_complete_is_ceil_half(n):
    assert robustness(complete(n)) == math.ceil(n / 2)
    assert robustness(complete(n), method="milp") == math.ceil(n / 2)


@pytest.mark.parametrize("n", range(4, 10))  # C_3 = K_3 is 2-robust
def test_cycles_and_paths_are_1_robust(n):
    assert robustness(nx.cycle_graph(n)) == 1
    assert robustness(nx.path_graph(n)) == 1
    assert not is_r_robust(nx.cycle_graph(n), 2)


def test_disconnected_is_0_robust():
    G = nx.disjoint_union(complete(4), complete(4))
    assert robustness(G) == 0 and robustness(G, method="milp") == 0


def _merg_edges(n):
    g = math.ceil(n / 2)
    if n % 2:
        return 3 * g * (g - 1) // 2
    return {2: 1, 4: 5}.get(n, g * g + g * (g - 1) // 2 - 1)


@pytest.mark.parametrize("n", range(1, 17))
def test_merg_reaches_max_robustness(n):
    G = merg(n)
    assert G.number_of_nodes() == n and nx.number_of_selfloops(G) == 0
    assert G.number_of_edges() == _merg_edges(n)
    if n >= 2:
        assert robustness(G) == math.ceil(n / 2)


def test_merg_7_is_the_papers_graph():
    G = merg(7)
    assert G.number_of_edges() == 18 and robustness(G) == 4


@pytest.mark.parametrize("n", [4, 5, 6, 7])
def test_merg_edge_count_is_minimal(n):
    # Robustness never drops when an edge is added, so it is enough that no graph with one edge
    # fewer is ceil(n/2)-robust.
    g, m = math.ceil(n / 2), merg(n).number_of_edges()
    pairs = list(itertools.combinations(range(n), 2))
    for edges in itertools.combinations(pairs, m - 1):
        deg = [0] * n
        for a, b in edges:
            deg[a] += 1
            deg[b] += 1
        if min(deg) < g:  # an r-robust graph (r >= 2) has minimum degree >= r
            continue
        G = nx.Graph(edges)
        assert not is_r_robust(G, g), sorted(edges)


def test_milp_equals_exact_on_random_graphs():
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(2, 10)
        G = nx.gnp_random_graph(n, rng.uniform(0.2, 0.95), seed=rng.randrange(10**6))
        assert robustness(G, method="milp") == robustness(G, method="exact")


def test_exact_equals_definition_on_small_graphs():
    rng = random.Random(1)
    for _ in range(25):
        n = rng.randint(2, 7)
        G = nx.gnp_random_graph(n, rng.uniform(0.3, 0.9), seed=rng.randrange(10**6))
        assert robustness(G) == _brute_force(G)


def test_directed_graphs_use_in_neighbours():
    D = nx.DiGraph([(0, 1), (1, 2), (2, 0)])
    assert robustness(D) == _brute_force(D) == robustness(D, method="milp") == 1
    star_in = nx.DiGraph([(i, 0) for i in range(1, 4)])  # leaves hear nobody
    assert robustness(star_in) == 0


@pytest.mark.parametrize("method", ["exact", "milp"])
def test_violating_pair_is_a_certificate(method):
    G = nx.cycle_graph(8)
    S1, S2 = violating_pair(G, 2, method=method)
    assert S1 and S2 and not (S1 & S2)
    assert reach(G, S1) < 2 and reach(G, S2) < 2
    assert violating_pair(merg(7), 4, method=method) is None


@pytest.mark.parametrize("n,r", [(5, 3), (7, 4), (10, 3), (12, 2), (9, 1)])
def test_preferential(n, r):
    G = preferential(n, r)
    assert G.number_of_nodes() == n
    assert robustness(G) >= r
    assert all(G.degree(v) == r for v in range(2 * r - 1, n))


def test_erdos_renyi_is_seeded_and_robust():
    a, b = erdos_renyi(7, 4, seed=3), erdos_renyi(7, 4, seed=3)
    assert sorted(a.edges()) == sorted(b.edges())
    assert is_r_robust(a, 4)
    c = erdos_renyi(12, 3, seed=5)
    assert is_r_robust(c, 3) and nx.number_of_selfloops(c) == 0
    assert {tuple(sorted(e)) for e in erdos_renyi(12, 3, seed=6).edges()} != {tuple(sorted(e)) for e in c.edges()}


def test_erdos_renyi_gives_up_clearly():
    with pytest.raises(RuntimeError, match="no sample certified 5-robust"):
        erdos_renyi(10, 5, seed=0, max_tries=3)


def test_bad_arguments():
    for call in (lambda: complete(0), lambda: merg(-1), lambda: preferential(5, 0),
                 lambda: preferential(4, 3), lambda: erdos_renyi(6, 4, seed=0), lambda: erdos_renyi(0, 1, seed=0),
                 lambda: is_r_robust(complete(3), 0), lambda: robustness(complete(3), method="nope"),
                 lambda: f_local(complete(3), {0}, -1), lambda: f_local(complete(3), {7}, 1)):
        with pytest.raises(ValueError):
            call()


def test_self_loops_are_rejected():
    G = complete(4)
    G.add_edge(2, 2)
    for call in (lambda: robustness(G), lambda: is_r_robust(G, 1), lambda: f_local(G, {0}, 1)):
        with pytest.raises(ValueError, match="self-loop"):
            call()


def test_f_local():
    G = nx.star_graph(4)  # hub 0, leaves 1..4
    assert f_local(G, {0}, 1)  # each leaf has one faulty neighbour
    assert not f_local(G, {1, 2}, 1)  # the hub has two
    assert f_local(G, {1, 2}, 2)
    assert f_local(merg(7), {6}, 1) and not f_local(complete(7), {4, 5, 6}, 2)


# The reference code's gamma-MERG(7) (seed 1234): a 5-clique 0..4 plus nodes 5 and 6 tied to 0, 2, 3, 4.
REFERENCE_MERG7 = [[0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [1, 2], [1, 3], [1, 4], [2, 3], [2, 4], [2, 5],
                   [2, 6], [3, 4], [3, 5], [3, 6], [4, 5], [4, 6]]


def test_from_edges_builds_exactly_the_given_graph():
    G = from_edges(REFERENCE_MERG7, 7)
    assert [G.degree(i) for i in range(7)] == [6, 4, 6, 6, 6, 4, 4]  # ours: [5, 5, 6, 6, 6, 4, 4]
    assert sorted(map(sorted, G.edges)) == REFERENCE_MERG7 and robustness(G) == 4 and f_local(G, {4, 5, 6}, 3)
    assert [merg(7).degree(i) for i in range(7)] == [5, 5, 6, 6, 6, 4, 4]
    assert sorted(from_edges([(1, 0), (2, 1)], 3).edges) == [(0, 1), (1, 2)]


@pytest.mark.parametrize("edges, n, problem", [
    ([[0, 1], [1, 2]], 4, r"nodes \[3\] have no edge"),
    ([[0, 1], [1, 7]], 3, "outside 0..2"),
    ([[0, -1]], 2, "outside 0..1"),
    ([[0, 1], [1, 1]], 2, "self-loop"),
    ([[0, 1], [1, 0]], 2, "given twice"),
    ([[0, 1, 2]], 3, "not a pair"),
    ([["0", "1"]], 2, "not a pair"),
    ([[0.0, 1]], 2, "not a pair"),
    ({"0": 1}, 2, "list of"),
])
def test_from_edges_refuses_a_bad_edge_list(edges, n, problem):
    with pytest.raises(ValueError, match=problem):
        from_edges(edges, n)
