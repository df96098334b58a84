

def test_a_check_outside_the_entries_says_vmap():
    """A function without a transform entry that checks its input under vmap names the input and vmap
    (before: vmap's own "data-dependent control flow" error from inside the check)."""
    with pytest.raises(RuntimeError, match=r"Q cannot be checked .* torch\.func\.vmap"):
        vmap(lambda q: sinkflow.dot_scores(q, q))(_input((2, 3, 2)))
