"""A fuzzing campaign: N generated models through the oracle, in at most 2 worker processes, resumable.

Model `i` of a campaign with seed `S` has id ``S-i`` and is ``generate("S-i")``. Its fusion options
come from the id too (`options_for`): the lowering (runtime 70%, onnx 15%, functions 15%) and the vertical
rules (the defaults 75%, every rule including the opt-in skip_layernorm 25%). Each model is fused with
the pass sets of `pass_sets_for`: ``vertical``, ``all`` (vertical, horizontal, mixed) and ``other`` (one
of `OTHER_ORDERS`: single passes and other orders, where plan-merging and naming bugs hide).

Every finished model appends one JSON line to ``DIR/results.jsonl`` (so a campaign that is stopped
continues where it left off when run again with the same seed and a larger or equal N); failing models
are written to ``DIR/failures/``. Then each failure class (kind, blamed pass:rule, symptom) gets one
example shrunk (`shrink.shrink`) to ``DIR/classes/<slug>.onnx``; `summary.write` writes summary.json
and summary.md.

A model that takes longer than `timeout` seconds is recorded as a ``timeout`` outcome: the worker
interrupts itself (SIGALRM), and a worker stuck in native code is killed by the parent after twice that.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import queue
import random
import signal
import time
import warnings
from pathlib import Path

import onnx

from ..passes.vertical import RULE_NAMES
from ..verification.judge import Case
from . import summary
from .diagnose import diagnose
from .generator import generate_with_tags
from .oracle import Kind, Outcome, REPLAYABLE, blame, judge
from .shrink import same_failure, shrink

__all__ = ["run_campaign", "run_one", "options_for", "pass_sets_for", "OTHER_ORDERS", "load_results",
           "shrink_classes"]

OTHER_ORDERS = (("horizontal",), ("mixed",), ("horizontal", "vertical"), ("horizontal", "mixed"),
                ("mixed", "vertical"), ("mixed", "horizontal", "vertical"), ("horizontal", "vertical", "mixed"),
                ("vertical", "mixed"), ("cleanup", "vertical", "horizontal", "mixed"))


class _Timeout(Exception):
    pass


def options_for(model_id: str) -> dict:
    """The fuse() options model `model_id` is fused with (deterministic)."""
    rng = random.Random(f"fusionlab.fuzz.options/{model_id}")
    r = rng.random()
    options: dict = {"lower": "runtime" if r < 0.7 else "onnx" if r < 0.85 else "functions"}
    if rng.random() < 0.25:
        options["rules"] = list(RULE_NAMES)
    return options


def pass_sets_for(model_id: str) -> dict[str, tuple]:
    rng = random.Random(f"fusionlab.fuzz.passes/{model_id}")
    return {"vertical": ("vertical",), "all": ("vertical", "horizontal", "mixed"), "other": rng.choice(OTHER_ORDERS)}


def _alarm(_sig, _frame):
    raise _Timeout()


def run_one(model_id: str, out_dir: str | None = None, *, n_draws: int = 3, do_blame: bool = True) -> dict:
    """Generate model `model_id`, judge it with every pass set, blame failures; one result record."""

    t0 = time.monotonic()
    model, tags = generate_with_tags(model_id)
    options = options_for(model_id)
    case = Case(model, n_draws, options)
    rec = {"id": model_id, "nodes": len(model.graph.node), "tags": tags, "options": options, "outcomes": {}}
    for name, passes in pass_sets_for(model_id).items():
        try:
            o = judge(case, passes)
        except _Timeout:
            raise
        except Exception as exc:  # noqa: BLE001 - the oracle itself failed: record, do not stop the campaign
            o = Outcome(Kind.ERROR, f"oracle: {type(exc).__name__}: {exc}", f"oracle error: {type(exc).__name__}")
        d = {**o.to_dict(), "passes": list(passes)}
        if o.failed and do_blame:
            b = blame(case, passes, o)
            d["blame"] = b.label
            d["blame_passes"] = list(b.passes)
            d["blame_options"] = b.options()
        rec["outcomes"][name] = d
    if out_dir and any(o["kind"] in REPLAYABLE for o in rec["outcomes"].values()):
        folder = Path(out_dir) / "failures"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{model_id}.onnx").write_bytes(model.SerializeToString())
    rec["seconds"] = round(time.monotonic() - t0, 3)
    return rec


def _worker(tasks, results, out_dir: str, timeout: float, n_draws: int) -> None:
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGALRM, _alarm)
    while True:
        item = tasks.get()
        if item is None:
            return
        kind, payload = item
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)
            if kind == "model":
                rec = run_one(payload, out_dir, n_draws=n_draws)
            else:
                rec = _shrink_task(payload, out_dir, n_draws)
        except _Timeout:
            rec = {"id": payload if kind == "model" else payload["slug"], "timeout": True}
        except Exception as exc:  # noqa: BLE001 - the generator or oracle failed on this id: report it
            rec = {"id": payload if kind == "model" else payload["slug"], "error": f"{type(exc).__name__}: {exc}"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        results.put((kind, rec))


class _Pool:
    """Up to `n` worker processes, one task each at a time, so a stuck one can be killed and replaced."""

    def __init__(self, n: int, out_dir: str, timeout: float, n_draws: int, recycle: int = 400):
        self.ctx = mp.get_context("spawn")
        self.n, self.out_dir, self.timeout, self.n_draws, self.recycle = n, out_dir, timeout, n_draws, recycle
        self.results = self.ctx.Queue()
        self.workers: list[dict] = []

    def _start(self) -> dict:
        tasks = self.ctx.Queue()
        p = self.ctx.Process(target=_worker, args=(tasks, self.results, self.out_dir, self.timeout, self.n_draws),
                             daemon=True)
        p.start()
        return {"proc": p, "tasks": tasks, "busy": None, "since": 0.0, "done": 0}

    def map(self, items: list[tuple], hard_timeout: float):
        """Yield (kind, record) for every (kind, payload) item, in completion order."""
        pending = list(reversed(items))
        self.workers = [self._start() for _ in range(min(self.n, len(items)))]
        outstanding = len(items)
        while outstanding:
            for w in self.workers:
                if w["busy"] is None and pending:
                    if w["done"] >= self.recycle:
                        w["tasks"].put(None)
                        w["proc"].join(timeout=10)
                        w.update(self._start())
                    w["busy"] = pending.pop()
                    w["since"] = time.monotonic()
                    w["tasks"].put(w["busy"])
            try:
                kind, rec = self.results.get(timeout=1.0)
            except queue.Empty:
                kind = rec = None
            if rec is not None:
                for w in self.workers:
                    b = w["busy"]
                    if b is not None and (b[1] == rec["id"] or (isinstance(b[1], dict) and b[1].get("slug") == rec["id"])):
                        w["busy"], w["done"] = None, w["done"] + 1
                        break
                outstanding -= 1
                yield kind, rec
            for w in self.workers:
                if w["busy"] is not None and time.monotonic() - w["since"] > hard_timeout:
                    kind, payload = w["busy"]
                    w["proc"].kill()  # a worker this pool started, stuck past its own alarm
                    w["proc"].join(timeout=10)
                    w.update(self._start())
                    outstanding -= 1
                    yield kind, {"id": payload if kind == "model" else payload["slug"], "timeout": True, "killed": True}
        for w in self.workers:
            w["tasks"].put(None)
        for w in self.workers:
            w["proc"].join(timeout=10)


def load_results(out_dir: Path) -> dict[str, dict]:
    path = Path(out_dir) / "results.jsonl"
    out: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by an interrupted run
                out[rec["id"]] = rec
    return out


def _slug(key: str) -> str:
    kind, blame_label = key.split(" | ")[:2]
    clean = "".join(c if c.isalnum() else "_" for c in f"{kind}_{blame_label}")[:60]
    return f"{clean}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def _shrink_task(payload: dict, out_dir: str, n_draws: int) -> dict:
    model = onnx.load(payload["path"])
    options = {**payload["options"], **payload["blame_options"]}
    passes = tuple(payload["blame_passes"])
    outcome = judge(Case(model, n_draws, options), passes)
    rec = {"id": payload["slug"], "key": payload["key"], "example": payload["example"], "passes": list(passes),
           "options": options, "before_nodes": len(model.graph.node)}
    if not outcome.failed:
        rec["note"] = "the blamed pass set alone no longer fails"
        return rec
    small = shrink(model, same_failure(passes, outcome, options=options, n_draws=n_draws),
                   budget_s=payload["budget"])
    final = judge(Case(small, n_draws, options), passes)
    rec["diagnosis"] = diagnose(small, passes, final, options=options, n_draws=n_draws) if final.failed else []
    dest = Path(out_dir) / "classes" / f"{payload['slug']}.onnx"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(small.SerializeToString())
    rec.update(after_nodes=len(small.graph.node), path=str(dest), kind=final.kind, symptom=final.symptom,
               detail=final.detail)
    return rec


def shrink_classes(out_dir: Path, results: dict[str, dict], *, workers: int, budget: float, n_draws: int) -> dict:
    """Shrink one example of every failure class not shrunk yet; returns {slug: shrink record}."""
    path = Path(out_dir) / "shrunk.jsonl"
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["id"]] = rec
    examples: dict[str, dict] = {}
    for rec in sorted(results.values(), key=lambda r: (r.get("nodes", 1e9), r["id"])):
        for o in rec.get("outcomes", {}).values():
            if o["kind"] in REPLAYABLE and "blame" in o:
                key = class_key(o)
                examples.setdefault(key, {"slug": _slug(key), "key": key, "example": rec["id"],
                                          "path": str(Path(out_dir) / "failures" / f"{rec['id']}.onnx"),
                                          "options": rec["options"], "blame_passes": o["blame_passes"],
                                          "blame_options": o["blame_options"], "budget": budget})
    todo = [("shrink", e) for e in examples.values() if e["slug"] not in done]
    if todo:
        pool = _Pool(workers, str(out_dir), budget * 2 + 60, n_draws, recycle=50)
        with path.open("a") as fh:
            for _, rec in pool.map(todo, hard_timeout=budget * 4 + 120):
                done[rec["id"]] = rec
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
    return {e["slug"]: done.get(e["slug"], {}) for e in examples.values()}


def run_campaign(n: int, seed: int, out_dir, *, workers: int = 2, timeout: float = 60.0, n_draws: int = 3,
                 shrink: bool = True, shrink_budget: float = 90.0, progress: bool = True) -> dict:
    """Run (or continue) a campaign; returns the summary dict (also written to out_dir).

    `workers` is 1 or 2 processes; 0 runs the graphs in this process (no timeout: for tests).
    """
    workers = max(0, min(int(workers), 2))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = load_results(out)
    ids = [f"{seed}-{i}" for i in range(n)]
    todo = [("model", i) for i in ids if i not in results]
    t0 = time.monotonic()
    if todo:
        stream = (_Pool(workers, str(out), timeout, n_draws).map(todo, hard_timeout=2 * timeout + 30) if workers
                  else (("model", run_one(i, str(out), n_draws=n_draws)) for _, i in todo))
        with (out / "results.jsonl").open("a") as fh:
            for k, (_, rec) in enumerate(stream, 1):
                results[rec["id"]] = rec
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                if progress and (k % 100 == 0 or k == len(todo)):
                    rate = k / (time.monotonic() - t0)
                    print(f"{k}/{len(todo)} models ({rate:.1f}/s)", flush=True)
    mine = {i: results[i] for i in ids if i in results}
    shrunk = shrink_classes(out, mine, workers=max(1, workers), budget=shrink_budget, n_draws=n_draws) if shrink else {}
    return summary.write(out, mine, shrunk, seed=seed, wall_s=time.monotonic() - t0)

