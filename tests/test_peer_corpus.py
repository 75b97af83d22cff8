"""The vertical passes over onnxruntime's own graph-transformer test models (MIT, shared/peer-tests).

For every model: no crash, no hang; the result is either a clear refusal (ModelError), an unchanged
model, or a model onnxruntime loads and that matches the original on random inputs. Models the
original of which cannot run on random inputs (shape-inconsistent unit-test graphs) must still give a
fused model onnxruntime can load; they are listed, not hidden.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from fusionlab import ModelError, load, verify
from fusionlab.passes import fuse
from fusionlab.verification.runtime import make_feeds, run, session

pytestmark = pytest.mark.slow  # 440 models, five sweeps: `make check` leaves it to `make test`

PEER = next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "peer-tests", Path("/work/shared/peer-tests"))
             if p.exists()), Path(__file__).resolve().parents[2] / "shared" / "peer-tests")  # a worktree sits deeper
MODELS = PEER / "ort-transform" / "models"
SURVEY = PEER / "ort-transform" / "ORT_1.32_CPU_fusion_survey.tsv"
PER_MODEL_SECONDS = 20


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _ort_errors() -> set[str]:
    """Models onnxruntime itself could not load (survey rows reading ERROR)."""
    if not SURVEY.exists():
        return set()
    out = set()
    for line in SURVEY.read_text().splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) > 2 and any(c.strip() == "ERROR" for c in cols[2:]):
            out.add(cols[0])
    return out


def _check_one(path: Path, ort_errors: set[str], lower: str = "runtime", passes=("vertical",)) -> str:
    rel = path.relative_to(MODELS).as_posix()
    try:
        graph = load(path)
    except ModelError:
        return "refused"
    try:
        res = fuse(graph, passes=passes, lower=lower)
    except ModelError:
        return "refused"
    if len(res.plan) == 0 and res.after == res.before:
        return "unchanged"
    # no groups but a changed graph: preparation (clean-up, constant folding) did something; verified below
    if tuple(passes) == ("vertical",) and len(res.plan):
        assert rel not in ort_errors, f"{rel}: onnxruntime cannot load the original, yet we rewrote it"
    try:
        session(graph)
    except ModelError:
        # e.g. training-only contrib ops: nothing can be run or compared; not crashing is all we can ask
        return "rewritten, original not loadable by onnxruntime"
    fused_session = session(res.graph)  # must load: raises ModelError (test failure) otherwise
    try:
        ref = session(graph)
        feeds = make_feeds(graph, sess=ref)
        run(ref, feeds)
    except Exception:
        return "fused, original not runnable on random inputs"
    report = verify(graph, res.graph, feeds=feeds, fused_session=fused_session)
    if not report.ok and all("nondeterministic" in o.problem for o in report.outputs if not o.ok):
        return "fused, original nondeterministic (training-mode Dropout)"
    assert report.ok, f"{rel}: fused model differs\n{report.table()}"
    return "fused and verified"


def _run_corpus(lower: str, passes=("vertical",)) -> dict[str, list[str]]:
    paths = sorted(MODELS.rglob("*.onnx"))
    assert len(paths) > 100
    ort_errors = _ort_errors()
    outcome: dict[str, list[str]] = {}
    failures: list[str] = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for path in paths:
            rel = path.relative_to(MODELS).as_posix()
            signal.alarm(PER_MODEL_SECONDS)
            try:
                outcome.setdefault(_check_one(path, ort_errors, lower, passes), []).append(rel)
            except _Timeout:
                failures.append(f"{rel}: took over {PER_MODEL_SECONDS} s")
            except AssertionError as exc:
                failures.append(str(exc))
            except Exception as exc:  # a crash
                failures.append(f"{rel}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert not failures, "\n".join(failures)
    return outcome


@pytest.mark.skipif(not MODELS.exists(), reason="peer corpus not found at ../shared/peer-tests relative to the repo")
@pytest.mark.parametrize("lower", ["runtime", "onnx", "functions"])
def test_vertical_passes_over_ort_transform_corpus(lower):
    outcome = _run_corpus(lower)
    assert len(outcome.get("fused and verified", [])) >= (15 if lower == "onnx" else 35), \
        {k: len(v) for k, v in outcome.items()}


@pytest.mark.skipif(not MODELS.exists(), reason="peer corpus not found at ../shared/peer-tests relative to the repo")
def test_all_passes_over_ort_transform_corpus():
    """vertical, then horizontal, then mixed (lowered to local functions): same contract."""
    outcome = _run_corpus("runtime", passes=("vertical", "horizontal", "mixed"))
    assert len(outcome.get("fused and verified", [])) >= 200, {k: len(v) for k, v in outcome.items()}


def _original_runs(path: Path) -> tuple[bool, str]:
    """Whether onnxruntime (optimisations off) loads the original and runs it on `fuse`'s verification inputs;
    decided without fusionlab's loader or passes (the feeds are `runtime.make_feeds`', as `fuse` verifies with)."""
    import onnx
    import onnxruntime as ort

    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001
        return False, f"onnx cannot read it: {exc}"
    if not proto.graph.output:
        return False, "no outputs"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        return False, f"onnxruntime cannot load it: {str(exc).splitlines()[0]}"
    try:
        for seed in range(3):  # verify's draws
            sess.run(None, make_feeds(proto, seed=seed, sess=sess))
    except Exception as exc:  # noqa: BLE001
        return False, f"onnxruntime cannot run it: {str(exc).splitlines()[0][:120]}"
    return True, ""


@pytest.mark.skipif(not MODELS.exists(), reason="peer corpus not found at ../shared/peer-tests relative to the repo")
def test_cli_exit_class_of_every_model(tmp_path, capsys):
    """`fusionlab fuse` on each of the 440 models (issue 19): never exit 3 (an internal error is fusionlab's bug, and
    these are valid models); exit 2 (one line on stderr naming the user's model) exactly where onnxruntime cannot
    load or run the original on the verification inputs; exit 1 ("not equivalent") only where the original is
    nondeterministic (training-mode Dropout); otherwise 0 and a fused model written."""
    from fusionlab.cli import main
    from fusionlab.verification.runtime import random_sources

    paths = sorted(MODELS.rglob("*.onnx"))
    assert len(paths) == 440
    wrong: list[str] = []
    classes: dict[int, int] = {}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for path in paths:
            rel = path.relative_to(MODELS).as_posix()
            out = tmp_path / "fused.onnx"
            out.unlink(missing_ok=True)
            runs, why = _original_runs(path)
            signal.alarm(3 * PER_MODEL_SECONDS)
            try:
                rc = main(["fuse", str(path), "-o", str(out)])
            except _Timeout:
                wrong.append(f"{rel}: took over {3 * PER_MODEL_SECONDS} s")
                continue
            finally:
                signal.alarm(0)
            err = capsys.readouterr().err.strip()
            classes[rc] = classes.get(rc, 0) + 1
            if rc == 3:
                wrong.append(f"{rel}: exit 3: {err}")
            elif rc == 2:
                if runs:
                    wrong.append(f"{rel}: exit 2 but onnxruntime runs the original: {err}")
                elif len(err.splitlines()) != 1 or str(path) not in err:
                    wrong.append(f"{rel}: exit 2 without one line naming the model: {err!r}")
            elif rc == 1:
                if not random_sources(str(path)):
                    wrong.append(f"{rel}: exit 1 (not equivalent) and the original is deterministic")
            elif rc == 0:
                if not runs:
                    wrong.append(f"{rel}: exit 0 but onnxruntime cannot run the original ({why})")
                elif not out.exists():
                    wrong.append(f"{rel}: exit 0 and nothing written")
            else:
                wrong.append(f"{rel}: exit {rc}: {err}")
            if rc != 0 and out.exists():
                wrong.append(f"{rel}: exit {rc} and a model was written")
    finally:
        signal.signal(signal.SIGALRM, old)
    assert not wrong, f"{classes}\n" + "\n".join(wrong)
    assert classes.get(0, 0) >= 350, classes
