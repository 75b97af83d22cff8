"""The second exercise of notebook 15: the ATC switch file that turns off the passes a plan's groups are filed under."""

from fusionlab.export import cann


def _passes(plan, *, documented_only=True):
    result = cann.fusion_result(plan)
    names = [name for stage in ("graph_fusion", "ub_fusion") for name in result[stage]]
    return [n for n in names if not n.startswith("Fusionlab")] if documented_only else names


def switch_file(plan):
    """Reference: the documented ATC passes of the plan's fusion_result.json, off, each in its stage."""
    return cann.fusion_switch(_passes(plan))


def switch_file_with_fusionlab_names(plan):
    """WRONG: switches off every name in fusion_result.json, fusionlab's own labels too."""
    return cann.fusion_switch(_passes(plan, documented_only=False))


def switch_file_one_stage(plan):
    """WRONG: puts every pass under GraphFusion (TbeCommonRules0FusionPass is a UB fusion pass)."""
    import json

    return json.dumps({"Switch": {"GraphFusion": {n: "off" for n in _passes(plan)}, "UBFusion": {}}}, indent=4)


def switch_file_all(plan):
    """WRONG: everything off, more than the plan's passes."""
    return cann.fusion_switch(all_off=True)


def switch_file_stub(plan):
    ...  # the notebook's stub

#: What tests/test_exercises.py grades (see solutions/__init__.py).
CHECKER = "atcswitch"
REFERENCE = switch_file
WRONG = [(switch_file_one_stage, 0, "is a pass of UBFusion"), (switch_file_all, 0, "ALL under GraphFusion"),
         (switch_file_with_fusionlab_names, 2, "no documented ATC pass")]
STUB = switch_file_stub
