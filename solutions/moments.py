"""The exercise of notebook 09: merge two blocks' (count, mean, M2), Chan's step of Welford's one-pass variance."""


def merge(a, b):
    """Reference: the mean moves toward b's by its share of the count; M2 adds both blocks' M2 and the spread
    between their means, delta² · count_a · count_b / count."""
    na, ma, qa = a
    nb, mb, qb = b
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), qa + qb + delta * delta * (na * nb / n)


def merge_sums_of_squares(a, b):
    """WRONG: the naive two-moment form: back to Σx and Σx², add, and take Σx² - n · mean² (cancels in float32)."""
    na, ma, qa = a
    nb, mb, qb = b
    n = na + nb
    s1 = na * ma + nb * mb
    s2 = (qa + na * ma * ma) + (qb + nb * mb * mb)
    mean = s1 / n
    return n, mean, s2 - n * mean * mean


def merge_no_delta(a, b):
    """WRONG: adds the M2s and forgets the spread between the two blocks' means."""
    na, ma, qa = a
    nb, mb, qb = b
    n = na + nb
    return n, ma + (mb - ma) * (nb / n), qa + qb


def merge_delta_weighted_wrongly(a, b):
    """WRONG: the delta² term weighted by count_a / count (the mean's weight), not count_a · count_b / count."""
    na, ma, qa = a
    nb, mb, qb = b
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), qa + qb + delta * delta * (na / n)


def merge_stub(a, b):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "moments"
REFERENCE = merge
WRONG = [(merge_sums_of_squares, 5, "sums of squares"), (merge_no_delta, 0, "delta² term"),
         (merge_delta_weighted_wrongly, 0, "weighted wrongly")]
STUB = merge_stub
