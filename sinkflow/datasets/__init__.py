r"""Long Range Arena tasks generated offline: ListOps and Pathfinder.

Both Long Range Arena (LRA) tasks that the Skyformer paper reports are defined by
generators, not by downloads; this folder rebuilds them from their published definitions.

* :func:`listops` — nested ``MAX`` / ``MIN`` / ``MED`` / ``SM`` (sum modulo 10) expressions
  over the digits 0-9 in LRA's token format (``[MAX 2 9 [MIN 4 7 ] 0 ]``), labelled by
  their value (10 classes). Defaults: LRA's generator (depth up to 10, 2 to 10 arguments
  per operator, an operator with probability 0.25 at every node above the maximal depth,
  500 to 2,000 tokens).
* :func:`pathfinder` — images with two markers that a dashed curved path does (label 1)
  or does not (label 0) connect, among distractor paths; 32 x 32 by default as LRA's
  Pathfinder. Paths never come closer than ``min_separation`` pixels to one another, so
  connectedness is a property of the geometry, not of the dashes; every label is then
  checked by a flood fill of the undashed rendering including the marker squares, and an
  image where it disagrees (a marker touching a neighbouring path) is drawn again. The
  geometry follows the published description (curved dashed paths, end markers,
  distractors); dash sizes and path lengths are this module's defaults, not LRA's exact
  pixel statistics.

Both are deterministic by seed and vectorized or tight enough to make 10,000 examples in
seconds. ``cache=True`` stores a generated set under :func:`cache_dir` (``$SINKFLOW_CACHE``
or the platform's user cache directory) and reloads it on the next call with the same
arguments. :func:`listops_tokens` and :func:`pathfinder_tokens` turn both into token
sequences for a Transformer.
"""

from sinkflow.datasets._cache import cache_dir
from sinkflow.datasets._listops import LISTOPS_VOCAB, listops, listops_tokens
from sinkflow.datasets._pathfinder import pathfinder, pathfinder_tokens

__all__ = ["cache_dir", "LISTOPS_VOCAB", "listops", "listops_tokens", "pathfinder", "pathfinder_tokens"]
