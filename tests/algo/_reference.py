"""Straightforward references for the algo tests: plain Python loops over floats (lists of lists),
written independently of the vectorised code in ``asyncrl.algo`` (no torch here)."""

from __future__ import annotations

import math


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def pop_std(xs: list[float]) -> float:
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def grpo(rewards: list[list[float]], eps: float) -> list[list[float]]:
    out = []
    for group in rewards:
        m, s = mean(group), pop_std(group)
        if max(group) == min(group):
            out.append([0.0] * len(group))
        else:
            out.append([(r - m) / (s + eps) for r in group])
    return out


def rloo(rewards: list[list[float]]) -> list[list[float]]:
    out = []
    for group in rewards:
        row = []
        for i, r in enumerate(group):
            others = [x for j, x in enumerate(group) if j != i]
            row.append(r - sum(others) / len(others))
        out.append(row)
    return out


def reinforce_pp(rewards: list[list[float]], eps: float) -> list[list[float]]:
    centred = [[r - mean(group) for r in group] for group in rewards]
    flat = [c for row in centred for c in row]
    s = pop_std(flat)
    return [[c / (s + eps) if abs(c) > 1e-15 else 0.0 for c in row] for row in centred]


def gae(rewards, values, mask, gamma: float, lam: float):
    """Per row: collect the masked steps, run the textbook backward recursion on them."""
    adv = [[0.0] * len(r) for r in rewards]
    ret = [[0.0] * len(r) for r in rewards]
    for i in range(len(rewards)):
        steps = [t for t in range(len(rewards[i])) if mask[i][t]]
        last_gae = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_v = values[i][steps[k + 1]] if k + 1 < len(steps) else 0.0
            delta = rewards[i][t] + gamma * next_v - values[i][t]
            last_gae = delta + gamma * lam * last_gae
            adv[i][t] = last_gae
            ret[i][t] = last_gae + values[i][t]
    return adv, ret


def behaviour_weights(prox_row, behav_row, toks, cap, mode, level):
    """(weight per loss token, set of dropped tokens) for one sequence."""
    w = {t: math.exp(prox_row[t] - behav_row[t]) for t in toks}
    dropped: set[int] = set()
    if cap is None or not toks:
        return w, dropped
    if level == "token":
        for t in toks:
            if w[t] > cap:
                if mode == "mask":
                    dropped.add(t)
                else:
                    w[t] = cap
    else:
        geo = math.exp(mean([prox_row[t] - behav_row[t] for t in toks]))
        if mode == "mask":
            if geo > cap:
                dropped = set(toks)
        else:
            for t in toks:
                w[t] = min(geo, cap)
    return w, dropped


def clip(r: float, eps_clip: float, eps_clip_high: float | None) -> float:
    lo = 1.0 - eps_clip
    hi = 1.0 + (eps_clip if eps_clip_high is None else eps_clip_high)
    return min(max(r, lo), hi)


def policy_terms(
    logp,
    prox,
    behav,
    adv,
    mask,
    *,
    eps_clip=0.2,
    eps_clip_high=None,
    dual_clip=None,
    behav_cap=None,
    behav_cap_mode="mask",
    behav_cap_level="token",
    loss_type="ppo",
    drop=None,
):
    """Per-token loss terms (after behaviour weighting/capping), 0 off the mask; ``drop``: rows of
    0/1, tokens dropped by an outside mask (version gap, M2PO)."""
    terms = []
    for i in range(len(logp)):
        row_terms = [0.0] * len(logp[i])
        toks = [t for t in range(len(logp[i])) if mask[i][t]]
        w, dropped = behaviour_weights(prox[i], behav[i], toks, behav_cap, behav_cap_mode, behav_cap_level)
        seq_ratio = math.exp(mean([logp[i][t] - prox[i][t] for t in toks])) if toks else 1.0
        for t in toks:
            a = adv[i][t]
            if loss_type == "pg":
                term = -a * logp[i][t]
            elif loss_type == "cispo":
                r = math.exp(logp[i][t] - prox[i][t])
                term = -clip(r, eps_clip, eps_clip_high) * a * logp[i][t]
            else:
                r = seq_ratio if loss_type == "gspo" else math.exp(logp[i][t] - prox[i][t])
                term = -min(r * a, clip(r, eps_clip, eps_clip_high) * a)
                if dual_clip is not None and a < 0:
                    term = min(term, -dual_clip * a)
            if t not in dropped and not (drop is not None and drop[i][t]):
                row_terms[t] = w[t] * term
        terms.append(row_terms)
    return terms


def normaliser(mask, i: int, aggregation: str) -> float:
    """What one token of sequence i is divided by under each aggregation (local denominators)."""
    n_tokens = sum(1 for row in mask for m in row if m)
    n_seqs = sum(1 for row in mask if any(row))
    if aggregation == "token_mean":
        return max(n_tokens, 1)
    if aggregation == "seq_mean_token_mean":
        return sum(1 for m in mask[i] if m) * max(n_seqs, 1)
    return len(mask) * len(mask[0])


def aggregate(terms, mask, aggregation: str, denominator: float | None = None) -> float:
    total = sum(terms[i][t] for i in range(len(terms)) for t in range(len(terms[i])) if mask[i][t])
    n_tokens = sum(1 for row in mask for m in row if m)
    if aggregation == "token_mean":
        return total / (denominator if denominator is not None else max(n_tokens, 1))
    if aggregation == "seq_mean_token_mean":
        seq_means = []
        for i in range(len(terms)):
            toks = [t for t in range(len(terms[i])) if mask[i][t]]
            if toks:
                seq_means.append(sum(terms[i][t] for t in toks) / len(toks))
        den = denominator if denominator is not None else max(len(seq_means), 1)
        return sum(seq_means) / den
    if aggregation == "seq_mean_token_sum":
        den = denominator if denominator is not None else len(terms) * len(terms[0])
        return total / den
    raise AssertionError(aggregation)


def policy_loss(logp, prox, behav, adv, mask, *, aggregation="token_mean", denominator=None, **kw) -> float:
    return aggregate(policy_terms(logp, prox, behav, adv, mask, **kw), mask, aggregation, denominator)


def cispo_grad(
    logp,
    prox,
    behav,
    adv,
    mask,
    *,
    eps_clip=0.2,
    eps_clip_high=None,
    behav_cap=None,
    behav_cap_mode="mask",
    behav_cap_level="token",
    aggregation="token_mean",
):
    """d loss / d logp for CISPO: -clip(r)·w·A / normaliser (the clipped weight is a constant)."""
    grads = []
    for i in range(len(logp)):
        toks = [t for t in range(len(logp[i])) if mask[i][t]]
        w, dropped = behaviour_weights(prox[i], behav[i], toks, behav_cap, behav_cap_mode, behav_cap_level)
        g = [0.0] * len(logp[i])
        for t in toks:
            if t in dropped:
                continue
            r = math.exp(logp[i][t] - prox[i][t])
            g[t] = -clip(r, eps_clip, eps_clip_high) * w[t] * adv[i][t] / normaliser(mask, i, aggregation)
        grads.append(g)
    return grads


def version_gap_keep(versions, current_version: int, max_gap: int, mask):
    """Rows of booleans: False where a loss token is more than ``max_gap`` versions old."""
    return [
        [not (m and v >= 0 and current_version - v > max_gap) for v, m in zip(vrow, mrow, strict=True)]
        for vrow, mrow in zip(versions, mask, strict=True)
    ]


def m2_keep(log_w, mask, tau: float):
    """M2PO's loop, literally: while the mean of (log w)^2 over the tokens left exceeds tau, drop
    the token with the largest value (ties: the later position first). Returns (keep rows, m2
    before, m2 after, dropped share)."""
    left = {(i, t): log_w[i][t] ** 2 for i in range(len(mask)) for t in range(len(mask[i])) if mask[i][t]}
    n = len(left)
    before = mean(list(left.values())) if left else 0.0
    while left and mean(list(left.values())) > tau:
        worst = max(left, key=lambda k: (left[k], k))
        del left[worst]
    keep = [[(not mask[i][t]) or (i, t) in left for t in range(len(mask[i]))] for i in range(len(mask))]
    after = mean(list(left.values())) if left else 0.0
    return keep, before, after, (n - len(left)) / n if n else 0.0
