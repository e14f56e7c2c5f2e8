"""The stage MILP: place runs of identical blocks on pipeline stages and pick each block's
option, exactly minimizing the cost model's step time for one outer candidate.

Blocks are compressed into *segments*, maximal runs of consecutive blocks of one class
(a GPT is three: embeddings, L layers, head). Blocks of a segment are interchangeable, so only
counts matter.

Sets: stages j = 0..J-1 (J = pp * v, stage j on pp rank j mod pp), segments s with L_s blocks,
options o of segment s's class.

Variables:
    n[j,s,o] in Z+      blocks of segment s on stage j running option o
    a[j,s]   in {0,1}   stage j holds some block of segment s
    u[r,s,o] in {0,1}   rank r runs some block of segment s with option o (for the max terms)
    h[j]     in {0,1}   stage j holds parameters (a collective's latency is paid once)
    T_j, Tmax, Rmax, E_j^1, E_j^2, E, X_r, Z_r, Opt, Off >= 0

Constraints (names in the code):
    place:       sum_{j,o} n[j,s,o] = L_s
    nonempty:    sum_{s,o} n[j,s,o] >= 1
    has_lo/hi:   a[j,s] <= sum_o n[j,s,o] <= L_s a[j,s]
    order_a:     C[j,s] >= L_s a[j,s+1]          (C = blocks of s placed on stages <= j)
    order_b:     C[j-1,s+1] <= L_{s+1} (1 - a[j,s])
                 (with both, every stage holds a contiguous range of blocks, in model order)
    time:        T_j = sum n[j,s,o] t[s,o] + p2p_j;  Tmax >= T_j;  Rmax >= sum_{j = r mod p} T_j
    dp:          E_j >= dp_comm_j - overlap_j  (per the ZeRO stage; see costmodel.dp_comm)
    memory:      sum_{j = r} sum n (state + inflight_j act) + X_r + Z_r + const_r <= capacity
                 X_r >= ws[s,o] u[r,s,o];  Z_r >= gather[s,o] u[r,s,o];  L_s u >= sum_{j=r} n
    host:        sum_{j = r} sum n host[s,o] <= host capacity per GPU
Objective (= costmodel.evaluate's step time):
    v = 1: sum_j T_j + (m - 1) Tmax;   v > 1: m Rmax + (p - 1) Tmax;   + E + Opt + Off
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import cvxpy as cp
import numpy as np

GIB = float(2**30)  # memory rows in GiB: keeps the MILP's coefficients well scaled


@dataclass
class StageProblem:
    """Numbers of one outer candidate, in the shape the MILP reads them."""

    pp: int
    v: int
    m: int
    seg_len: list[int]  # L_s
    time: list[np.ndarray]  # per segment: per-option time per micro-batch (fwd+bwd+tp comm)
    fwd: list[np.ndarray]
    bwd: list[np.ndarray]
    state: list[np.ndarray]  # device bytes of weights + grads + optimizer per block
    host: list[np.ndarray]
    act: list[np.ndarray]  # saved activations per in-flight micro-batch
    ws: list[np.ndarray]  # working set: transient + recompute peak
    gather: list[np.ndarray]  # ZeRO-3 / offload gathered-weight buffer (2 blocks), else 0
    optim: list[np.ndarray]  # optimizer step time per block
    offl: list[np.ndarray]  # offload transfer time per block
    pbytes: list[np.ndarray]  # parameters per block (for DP collectives)
    has_params: list[bool]
    p2p: list[float]  # per stage, per micro-batch
    inflight: list[int]  # per stage
    const_mem: list[float]  # per rank: reserved + p2p buffers + loss
    capacity: float
    host_capacity: float
    zero: int
    # DP collectives as affine functions of parameter count: (per-param seconds, latency)
    dp_ar: tuple[float, float]
    dp_rs: tuple[float, float]
    dp_ag: tuple[float, float]
    dp: int


@dataclass
class StageSolution:
    status: str
    objective: float
    counts: list[list[list[int]]]  # [stage][segment][option]
    solve_time_s: float


class _Structure:
    """One cvxpy problem per MILP shape, re-solved with new parameter values (DPP), so the
    hundreds of outer candidates of one model pay cvxpy's canonicalisation once per shape."""

    def __init__(self, J: int, P: int, seg_len: list[int], n_opts: list[int], has_params) -> None:
        S = len(seg_len)
        self.J, self.P, self.S = J, P, S
        par = cp.Parameter
        self.time = [par(k) for k in n_opts]
        self.memco = [[par(k) for k in n_opts] for _ in range(J)]
        self.host = [par(k) for k in n_opts]
        self.ws = [par(k, nonneg=True) for k in n_opts]
        self.gather = [par(k, nonneg=True) for k in n_opts]
        self.optim = [par(k) for k in n_opts]
        self.offl = [par(k) for k in n_opts]
        self.k1 = [[par(k) for k in n_opts] for _ in range(J)]
        self.k2 = [[par(k) for k in n_opts] for _ in range(J)]
        self.k1h, self.k2h = par(), par()
        self.p2p = par(J)
        self.const_mem = par(P)
        self.capacity, self.host_capacity = par(), par()
        self.c_sum, self.c_t, self.c_r = par(nonneg=True), par(nonneg=True), par(nonneg=True)
        n = [[cp.Variable(k, integer=True) for k in n_opts] for _ in range(J)]
        a = cp.Variable((J, S), boolean=True)
        h = cp.Variable(J, boolean=True)
        u = [[cp.Variable(k, boolean=True) for k in n_opts] for _ in range(P)]
        T = cp.Variable(J, nonneg=True)
        tmax, rmax, E = (cp.Variable(nonneg=True) for _ in range(3))
        e1, e2 = cp.Variable(J, nonneg=True), cp.Variable(J, nonneg=True)
        X, Z = cp.Variable(P, nonneg=True), cp.Variable(P, nonneg=True)
        opt, off = cp.Variable(nonneg=True), cp.Variable(nonneg=True)
        cons: list = []
        for s in range(S):
            cons.append(sum(cp.sum(n[j][s]) for j in range(J)) == seg_len[s])  # place
        for j in range(J):
            cons.append(sum(cp.sum(n[j][s]) for s in range(S)) >= 1)  # nonempty
            for s in range(S):
                cnt = cp.sum(n[j][s])
                cons += [n[j][s] >= 0, a[j, s] <= cnt, cnt <= seg_len[s] * a[j, s]]  # has
                if has_params[s]:
                    cons.append(h[j] >= a[j, s])
        cum = [[sum(cp.sum(n[k][s]) for k in range(j + 1)) for s in range(S)] for j in range(J)]
        for j in range(J):
            for s in range(S - 1):
                cons.append(cum[j][s] >= seg_len[s] * a[j, s + 1])  # order_a
                if j >= 1:
                    cons.append(cum[j - 1][s + 1] <= seg_len[s + 1] * (1 - a[j, s]))  # order_b
        for j in range(J):
            cons.append(T[j] == sum(n[j][s] @ self.time[s] for s in range(S)) + self.p2p[j])
            cons.append(tmax >= T[j])
            k1 = sum(n[j][s] @ self.k1[j][s] for s in range(S)) + self.k1h * h[j]
            k2 = sum(n[j][s] @ self.k2[j][s] for s in range(S)) + self.k2h * h[j]
            cons += [e1[j] >= k1, e2[j] >= k2, E >= e1[j] + e2[j]]  # dp
        for r in range(P):
            stages = range(r, J, P)
            cons.append(rmax >= sum(T[j] for j in stages))
            mem, host, opt_r, off_r = 0, 0, 0, 0
            for s in range(S):
                on_rank = sum(n[j][s] for j in stages)
                cons.append(seg_len[s] * u[r][s] >= on_rank)
                cons.append(X[r] >= cp.multiply(self.ws[s], u[r][s]))
                cons.append(Z[r] >= cp.multiply(self.gather[s], u[r][s]))
                host = host + on_rank @ self.host[s]
                opt_r = opt_r + on_rank @ self.optim[s]
                off_r = off_r + on_rank @ self.offl[s]
                for j in stages:
                    mem = mem + n[j][s] @ self.memco[j][s]
            cons.append(mem + X[r] + Z[r] + self.const_mem[r] <= self.capacity)  # memory
            cons.append(host <= self.host_capacity)  # host
            cons += [opt >= opt_r, off >= off_r]
        pipeline = self.c_sum * cp.sum(T) + self.c_t * tmax + self.c_r * rmax
        self.n = n
        self.problem = cp.Problem(cp.Minimize(pipeline + E + opt + off), cons)

    def load(self, sp: StageProblem) -> None:
        J, P, S = self.J, self.P, self.S
        for s in range(S):
            self.time[s].value = sp.time[s]
            self.host[s].value = sp.host[s] / GIB
            self.ws[s].value = sp.ws[s] / GIB
            self.gather[s].value = sp.gather[s] / GIB
            self.optim[s].value = sp.optim[s]
            self.offl[s].value = sp.offl[s]
        for j in range(J):
            for s in range(S):
                self.memco[j][s].value = (sp.state[s] + sp.inflight[j] * sp.act[s]) / GIB
                k1, k2 = _dp_coefficients(sp, s)
                self.k1[j][s].value, self.k2[j][s].value = k1, k2
        self.k1h.value, self.k2h.value = _dp_latency(sp)
        self.p2p.value = np.asarray(sp.p2p, dtype=float)
        self.const_mem.value = np.asarray(sp.const_mem, dtype=float) / GIB
        self.capacity.value = sp.capacity / GIB
        self.host_capacity.value = sp.host_capacity / GIB
        if sp.v == 1:
            self.c_sum.value, self.c_t.value, self.c_r.value = 1.0, sp.m - 1.0, 0.0
        else:
            self.c_sum.value, self.c_t.value, self.c_r.value = 0.0, sp.pp - 1.0, float(sp.m)
        del P


def _dp_coefficients(sp: StageProblem, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-block coefficients of the exposed DP communication (costmodel.dp_comm), linear in
    the counts: e1 >= n @ k1 + k1h h, e2 >= n @ k2 + k2h h."""
    pb, fwd, bwd, m = sp.pbytes[s], sp.fwd[s], sp.bwd[s], sp.m
    zero = np.zeros_like(pb, dtype=float)
    if sp.dp == 1:
        return zero, zero
    ar, rs, ag = sp.dp_ar[0], sp.dp_rs[0], sp.dp_ag[0]
    if sp.zero == 0:
        return ar * pb - bwd, zero
    if sp.zero == 1:
        return rs * pb - bwd, ag * pb - fwd
    if sp.zero == 2:
        return m * (rs * pb - bwd), ag * pb - fwd
    return m * ((2 * ag + rs) * pb - fwd - bwd), zero


def _dp_latency(sp: StageProblem) -> tuple[float, float]:
    if sp.dp == 1:
        return 0.0, 0.0
    ar, rs, ag = sp.dp_ar[1], sp.dp_rs[1], sp.dp_ag[1]
    return {
        0: (ar, 0.0),
        1: (rs, ag),
        2: (sp.m * rs, ag),
        3: (sp.m * (2 * ag + rs), 0.0),
    }[sp.zero]


_STRUCTURES: dict[tuple, _Structure] = {}


def solve_stage_milp(sp: StageProblem, time_limit_s: float = 60.0) -> StageSolution:
    J = sp.pp * sp.v
    n_opts = [len(t) for t in sp.time]
    key = (J, sp.pp, tuple(sp.seg_len), tuple(n_opts), tuple(sp.has_params))
    st = _STRUCTURES.get(key)
    if st is None:
        st = _STRUCTURES[key] = _Structure(J, sp.pp, sp.seg_len, n_opts, sp.has_params)
    st.load(sp)
    start = time.perf_counter()
    try:
        st.problem.solve(solver=cp.HIGHS, time_limit=time_limit_s, mip_rel_gap=0.0)
    except cp.error.SolverError:
        return StageSolution("error", float("inf"), [], time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    status = st.problem.status
    if status not in ("optimal", "optimal_inaccurate"):
        return StageSolution(status, float("inf"), [], elapsed)
    counts = [
        [[int(round(x)) for x in np.atleast_1d(st.n[j][s].value)] for s in range(st.S)]
        for j in range(J)
    ]
    return StageSolution(status, float(st.problem.value), counts, elapsed)
