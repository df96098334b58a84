"""ListOps, generated: nested MAX / MIN / MED / SM (sum modulo 10) expressions over the digits,
in LRA's token format, labelled by their value; and their token ids.
"""

from __future__ import annotations

import numpy as np

from sinkflow.datasets._cache import _cached

__all__ = ["LISTOPS_VOCAB", "listops", "listops_tokens"]


_OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")


_END = "]"


#: ListOps token vocabulary: index 0 is padding, then the digits, the operators and ``]``.
LISTOPS_VOCAB: tuple[str, ...] = ("<pad>",) + tuple(str(d) for d in range(10)) + _OPERATORS + (_END,)


def _listops_levels(rng: np.random.Generator, n_trees: int, max_depth: int, max_args: int, operator_p: float,
                    max_length: int) -> list[dict]:
    """Draw ``n_trees`` LRA trees level by level (breadth first), all at once.

    Level ``d`` holds, for every node at depth ``d + 1``: its tree, its parent's index in
    level ``d - 1`` (children of one parent are contiguous, in argument order), whether it
    is an operator, its operator or digit and its number of arguments. A tree whose tokens
    already reach ``max_length`` stops growing and is flagged in ``levels[0]["dead"]``.
    """
    levels = []
    tree = np.arange(n_trees)
    parent = np.full(n_trees, -1)
    tokens_so_far = np.zeros(n_trees, dtype=np.int64)
    dead = np.zeros(n_trees, dtype=bool)
    for depth in range(1, max_depth + 1):
        k = len(tree)
        is_op = rng.random(k) < operator_p if depth < max_depth else np.zeros(k, dtype=bool)
        arity = np.where(is_op, rng.integers(2, max_args + 1, size=k), 0)
        symbol = np.where(is_op, rng.integers(0, 4, size=k), rng.integers(0, 10, size=k))
        # final length >= tokens of the levels so far + this level + one token per pending child
        tokens_so_far += np.bincount(tree, weights=1 + is_op + arity, minlength=n_trees).astype(np.int64)
        dead |= tokens_so_far >= max_length
        arity = np.where(dead[tree], 0, arity)
        levels.append({"tree": tree, "parent": parent, "is_op": is_op, "arity": arity, "symbol": symbol})
        if not arity.any():
            break
        parent = np.repeat(np.arange(k), arity)
        tree = tree[parent]
        tokens_so_far -= np.bincount(tree, minlength=n_trees)  # pending children were counted once already
    levels[0]["dead"] = dead
    return levels


def _group_starts(arity: np.ndarray) -> np.ndarray:
    """Index of each expanded node's first child in the next level."""
    return np.concatenate([[0], np.cumsum(arity)[:-1]])[arity > 0]


def _reduce_levels(levels: list[dict]) -> None:
    """Bottom-up: token count ``size`` and ``value`` of every node (in place)."""
    below = None
    for lv in reversed(levels):
        size = np.where(lv["is_op"], 2, 1).astype(np.int64)
        value = lv["symbol"].astype(np.int64).copy()
        if below is not None:
            size += np.bincount(below["parent"], weights=below["size"], minlength=len(size)).astype(np.int64)
            expanded = lv["arity"] > 0
            starts = _group_starts(lv["arity"])
            v, counts, op = below["value"], lv["arity"][expanded], lv["symbol"][expanded]
            ordered = np.sort(below["parent"] * 10 + v) % 10  # children values sorted within each parent
            lo, hi = ordered[starts + (counts - 1) // 2], ordered[starts + counts // 2]
            results = np.select([op == 0, op == 1, op == 2], [np.maximum.reduceat(v, starts),
                                np.minimum.reduceat(v, starts), (lo + hi) // 2], np.add.reduceat(v, starts) % 10)
            value[expanded] = results
        lv["size"], lv["value"] = size, value
        below = lv


def _kept(levels: list[dict], keep: np.ndarray) -> list[dict]:
    """The levels restricted to the trees with ``keep[tree]``, renumbered ``0 .. keep.sum() - 1``."""
    tree_index = np.cumsum(keep) - 1
    out, remap = [], None
    for lv in levels:
        sel = np.flatnonzero(keep[lv["tree"]])
        sub = {k: lv[k][sel] for k in ("tree", "parent", "is_op", "arity", "symbol", "size")}
        sub["tree"] = tree_index[sub["tree"]]
        if remap is not None:
            sub["parent"] = remap[sub["parent"]]
        remap = np.full(len(lv["tree"]), -1)
        remap[sel] = np.arange(len(sel))
        out.append(sub)
    return out


def _preorder_tokens(levels: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (:data:`LISTOPS_VOCAB`) of every tree in pre-order, and each tree's offset."""
    root_size = levels[0]["size"]
    offset = np.concatenate([[0], np.cumsum(root_size)[:-1]]).astype(np.int64)
    flat = np.zeros(int(root_size.sum()), dtype=np.int64)
    position = np.zeros(len(root_size), dtype=np.int64)
    above = None
    for lv in levels:
        if above is not None:
            first = np.repeat(_group_starts(above["arity"]), above["arity"][above["arity"] > 0])
            before = np.concatenate([[0], np.cumsum(lv["size"])[:-1]])  # tokens of earlier siblings
            position = above["position"][lv["parent"]] + 1 + before - before[first]
        lv["position"] = position
        at = offset[lv["tree"]] + position
        flat[at] = np.where(lv["is_op"], 11 + lv["symbol"], 1 + lv["symbol"])
        flat[(at + lv["size"] - 1)[lv["is_op"]]] = len(LISTOPS_VOCAB) - 1
        above = lv
    return flat, offset


def listops(n_examples: int, seed: int = 0, *, max_depth: int = 10, max_args: int = 10, min_length: int = 500,
            max_length: int = 2000, operator_p: float = 0.25, cache: bool = False) -> tuple[list[str], np.ndarray]:
    r"""ListOps expressions in LRA format and their values (the 10 class labels).

    Grammar (LRA's generator): a node at depth ``d < max_depth`` is an operator with
    probability ``operator_p`` — one of ``[MAX``, ``[MIN``, ``[MED`` (median rounded down),
    ``[SM`` (sum modulo 10) — with 2 to ``max_args`` arguments (uniform) closed by ``]``,
    and otherwise a digit 0-9; nodes at ``max_depth`` are digits. The root is at depth 1.
    Expressions are drawn until one has ``min_length < tokens < max_length`` (LRA's
    strict bounds); duplicates are kept (LRA removed them from a 96,000-example set).

    Parameters
    ----------
    n_examples : int
    seed : int
    max_depth, max_args : int
        LRA: 10 and 10.
    min_length, max_length : int
        Token-count bounds, exclusive (LRA: 500 and 2,000).
    operator_p : float
        Probability that a node above ``max_depth`` is an operator (LRA: 0.25).
    cache : bool
        Store / reload the set under :func:`cache_dir`.

    Returns
    -------
    expressions : list of str
        Tokens separated by single spaces, e.g. ``"[MAX 2 9 [MIN 4 7 ] 0 ]"``.
    labels : numpy.ndarray of int64, shape (n_examples,)

    Examples
    --------
    >>> from sinkflow.datasets import listops
    >>> x, y = listops(3, seed=1, max_depth=3, max_args=3, min_length=4, max_length=20)
    >>> x[0], int(y[0])
    ('[MED 3 5 [MAX 0 5 4 ] ]', 5)
    """
    if n_examples < 0:
        raise ValueError(f"n_examples must be non-negative, got {n_examples}")
    if max_depth < 1 or max_args < 2:
        raise ValueError(f"need max_depth >= 1 and max_args >= 2, got {max_depth}, {max_args}")
    if not 0 <= min_length < max_length - 1:
        raise ValueError(f"need 0 <= min_length < max_length - 1, got {min_length}, {max_length}")
    if not 0 < operator_p <= 1:
        raise ValueError(f"operator_p must be in (0, 1], got {operator_p}")
    arguments = dict(n=n_examples, seed=seed, max_depth=max_depth, max_args=max_args, min_length=min_length,
                     max_length=max_length, operator_p=operator_p, version=1)

    def make():
        rng = np.random.default_rng(seed)
        expressions, labels = [], []
        batch = max(256, min(65_536, 16 * n_examples))
        for _ in range(1000):
            if len(expressions) >= n_examples:
                break
            levels = _listops_levels(rng, batch, max_depth, max_args, operator_p, max_length)
            _reduce_levels(levels)
            size = levels[0]["size"]
            keep = (size > min_length) & (size < max_length) & ~levels[0]["dead"]
            keep &= np.cumsum(keep) <= n_examples - len(expressions)
            flat, offset = _preorder_tokens(_kept(levels, keep))
            # not strict: with no tree kept, offset is still [0] (one entry) and the loop must run zero times
            for start, n_tok in zip(offset.tolist(), size[keep].tolist(), strict=False):
                expressions.append(" ".join([LISTOPS_VOCAB[t] for t in flat[start:start + n_tok].tolist()]))
            labels += levels[0]["value"][keep].tolist()
        else:
            raise RuntimeError("ListOps parameters almost never give an expression within the length bounds")
        return {"expressions": np.array(expressions, dtype=str), "labels": np.array(labels, dtype=np.int64)}

    out = _cached("listops", arguments, make, cache)
    return [str(s) for s in out["expressions"]], out["labels"].astype(np.int64)


def listops_tokens(expressions, length: int | None = None) -> np.ndarray:
    """Token ids (:data:`LISTOPS_VOCAB`) of ListOps expressions, right-padded with 0.

    Examples
    --------
    >>> from sinkflow.datasets import listops_tokens
    >>> listops_tokens(["[MAX 2 9 ]", "7"])
    array([[11,  3, 10, 15],
           [ 8,  0,  0,  0]])
    """
    index = {t: i for i, t in enumerate(LISTOPS_VOCAB)}
    rows = [[index[t] for t in e.split()] for e in expressions]
    width = max((len(r) for r in rows), default=0) if length is None else int(length)
    out = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"expression {i} has {len(r)} tokens, more than length={width}")
        out[i, : len(r)] = r
    return out
