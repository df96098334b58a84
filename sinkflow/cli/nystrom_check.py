"""``sinkflow nystrom-check``: Skyformer's spectral-norm Nyström theorem on random or given Q, K."""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    data = p.add_argument_group("data (random Gaussian unless --queries/--keys are given)")
    data.add_argument("--n", type=int, default=256, help="tokens (default 256)")
    data.add_argument("--p", type=int, default=64, help="head dimension (default 64)")
    data.add_argument("--scale", type=float, default=0.5,
                      help="standard deviation of random queries and keys (default 0.5)")
    data.add_argument("--queries", metavar="Q.npy", help="queries, array (n_q, p) in a .npy file")
    data.add_argument("--keys", metavar="K.npy", help="keys, array (n_k, p) in a .npy file (default: the queries)")
    p.add_argument("--landmarks", "-m", type=int, default=64, help="number of landmarks m (default 64)")
    p.add_argument("--eps", type=float, default=0.1, help="lambda = eps ||C||_2 (default 0.1)")
    p.add_argument("--delta", type=float, default=0.1, help="failure probability (default 0.1)")
    p.add_argument("--trials", type=int, default=20, help="Monte-Carlo landmark draws (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of the draws (default 0)")
    p.add_argument("--inverse", choices=["pinv", "iterative"], default="pinv",
                   help="pseudo-inverse (the theorem's estimator) or Skyformer's iterative inverse")
    p.add_argument("--looseness", action="store_true",
                   help="also search the smallest m that meets the bound and print m required / m observed")


def _load(path, name):
    import numpy as np

    try:
        arr = np.load(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"sinkflow nystrom-check: cannot read {name} from {path}: {exc}") from None
    return np.asarray(arr, dtype=np.float64)


def run(args) -> int:
    import numpy as np

    from sinkflow.bounds._nystrom_bounds import nystrom_check, smallest_sufficient_landmarks

    if args.queries is not None:
        Q = _load(args.queries, "queries")
        K = _load(args.keys, "keys") if args.keys is not None else Q
    elif args.keys is not None:
        print("sinkflow nystrom-check: --keys needs --queries", file=sys.stderr)
        return 2
    else:
        if args.n < 1 or args.p < 1:
            print("sinkflow nystrom-check: --n and --p must be positive", file=sys.stderr)
            return 2
        rng = np.random.default_rng(args.seed)
        Q, K = args.scale * rng.standard_normal((2, args.n, args.p))
    try:
        res = nystrom_check(Q, K, args.landmarks, eps=args.eps, delta=args.delta, trials=args.trials,
                            inverse=args.inverse, seed=args.seed)
    except (ValueError, TypeError) as exc:
        print(f"sinkflow nystrom-check: {exc}", file=sys.stderr)
        return 2
    print(res.summary())
    if args.looseness:
        m_obs = smallest_sufficient_landmarks(Q, K, args.eps, args.delta, args.trials, inverse=args.inverse,
                                              seed=args.seed)
        if m_obs is None:
            print("smallest sufficient m: none up to 8N (with replacement)")
        else:
            print(f"smallest m with empirical failure rate <= delta: {m_obs}; "
                  f"looseness m required / m observed = {res.m_required / m_obs:.1f}")
    return 0
