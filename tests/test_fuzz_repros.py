"""Every model that ever broke the passes, fused with the pass sets that broke it, under the strict oracle.

The models and their pass sets are listed in tests/data/fuzz_repros/manifest.json (README.md there says
where each came from). Each (model, passes) must either fuse correctly — valid, same interface, same
outputs on 8 input draws judged against a float64 reference (`fusionlab.fuzz.oracle`) — or be refused
with a reason (a ModelError, or the rule leaves the model unchanged).

Where a case fails today the manifest records the failure (`today`: kind and symptom). The case is then
`xfail(strict=True, raises=KnownFailure)`: it must fail in exactly that way (a different failure is a
real test failure), and once it passes, strict xfail turns it red so the record must be deleted.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from fusionlab.fuzz.oracle import judge
from fusionlab.verification.judge import Case

DATA = Path(__file__).resolve().parent / "data" / "fuzz_repros"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
N_DRAWS = 8


class KnownFailure(Exception):
    """The case failed exactly as the manifest says it does today."""


def _cases():
    for name, entry in MANIFEST.items():
        for case in entry["cases"]:
            passes = tuple(case["passes"])
            marks = []
            if "today" in case:
                t = case["today"]
                marks.append(pytest.mark.xfail(strict=True, raises=KnownFailure,
                                               reason=f"{t['kind']}: {t['detail']}"))
            yield pytest.param(name, passes, case.get("options", {}), case.get("today"), marks=marks,
                               id=f"{name[:-5]}[{'+'.join(passes)}]")


def test_every_model_in_the_folder_is_in_the_manifest():
    assert sorted(p.name for p in DATA.glob("*.onnx")) == sorted(MANIFEST)
    for name, entry in MANIFEST.items():
        assert entry["cases"] and entry["source"] and entry["class"], name


@pytest.mark.parametrize("name, passes, options, today", list(_cases()))
def test_repro_fuses_correctly_or_is_refused(name, passes, options, today):
    model = onnx.load(DATA / name)
    onnx.checker.check_model(model, full_check=True)  # the repro itself is a valid model
    outcome = judge(Case(model, N_DRAWS, options), passes)
    if outcome.kind == "refused":
        assert outcome.detail.strip(), "a refusal must say why"
    if outcome.failed and today and (outcome.kind, outcome.symptom) == (today["kind"], today["symptom"]):
        raise KnownFailure(outcome.detail)
    assert not outcome.failed, f"{outcome.kind}: {outcome.detail}"
