"""The exercise of notebook 08: the number of parts the cost model would cut a chain of k Adds into."""

from fusionlab import cost
from fusionlab.analysis import working_set
from fusionlab.lessons import overfusion


def best_parts(k, device):
    """Reference: price every split with the cost model and keep the fewest parts at the lowest latency."""
    chain = overfusion.add_chain(k)
    latency = [cost.plan_cost(chain, overfusion.chain_plan(chain, p), device).latency_s for p in range(1, k + 1)]
    return latency.index(min(latency)) + 1


def best_parts_never_split(k, device):
    """WRONG: 'fusion never loses', §1's table read as a rule for every chain."""
    return 1


def best_parts_fit_ub(k, device):
    """WRONG: the fewest parts whose groups each fit one core's UB at 16 KiB tiles (the mixed pass's budget rule)."""
    chain = overfusion.add_chain(k)
    tile = int(working_set.DEFAULT_TILE_KB * 1024)
    for p in range(1, k + 1):
        priced = cost.plan_cost(chain, overfusion.chain_plan(chain, p), device)
        if all(kc.buffers.bytes_at(tile) <= device.ub_bytes for kc in priced.kernels_detail):
            return p


def best_parts_halves(k, device):
    """WRONG: tries one group and two halves only."""
    chain = overfusion.add_chain(k)
    one, two = (cost.plan_cost(chain, overfusion.chain_plan(chain, p), device).latency_s for p in (1, 2))
    return 2 if two < one else 1


def best_parts_stub(k, device):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "splits"
REFERENCE = best_parts
WRONG = [(best_parts_never_split, 2, "fusion never loses"), (best_parts_fit_ub, 0, "fit the UB at 16 KiB tiles"),
         (best_parts_halves, 5, "the model's best is 3 parts")]
STUB = best_parts_stub
