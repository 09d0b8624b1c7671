"""The sweep targets of issue 33, measured: ASHA against the full grid, trainrun's TPE + ASHA
against Optuna's TPE + MedianPruner, the scheduler's overhead, and a synchronous sweep run twice.

Every sweep is `specs/mnist_asha.toml` (the tutorial model on MNIST; learning rate × batch
size × momentum; 1-epoch rungs of 20 steps up to 9 epochs; selected on the validation tenth of
the training files) or that spec with its `[sweep]` changed, written under `--out`:

- `grid`: for each sweep seed, the 27-trial grid trained to the end (no scheduler) and the
  same grid under ASHA (`specs/mnist_asha.toml` as it is). Prints per seed the best validation
  accuracy of each, their difference, and ASHA's optimizer steps as a fraction of the grid's;
  and ASHA's scheduler overhead: the time its trials spent pausing and resuming (each trial's
  time outside its training steps beyond what one uninterrupted launch of it spends there:
  starting, restoring the backup, the rung's evaluation, writing the backup) plus the
  driver's time between trials (deciding, launching), as a share of the sweep's wall time;
  and that share without the evaluations at the rungs (`rung_evaluation_s`: the decisions'
  inputs, which any scheduler pays); and the mechanism alone, pausing, resuming and deciding
  (`pause_resume_decision_pct`): that less the driver's cost of starting each trial, which
  the grid's sweep without a scheduler measures in the same sitting (`trial_start_ms`).
- `sync`: the grid under synchronous successive halving (`kind = "successive_halving"`), run
  twice into two folders: whether the two `results.csv` are byte-identical, and whether they
  are once any timing columns (`wall_s`, `steady_examples_per_s`) are left out (results.csv
  written before those moved to `timings.csv` held them).
- `overhead`: for each seed, only the ASHA sweep, with `--steps-per-epoch N` making every rung
  N steps an epoch (the tutorial's epoch is 70 steps; the spec's 20): its scheduler overhead as
  in `grid`, to see the same fixed costs against rungs of a realistic size; the cost of a
  trial's start comes from the same 27 trials run one epoch each without a scheduler first.
- `tpe`: for each seed, trainrun's TPE (9 random startup trials of 27) under ASHA over the
  same ranges as `benches/optuna_sweep.py` (learning rate log-uniform 0.003..0.03, batch 32,
  64 or 128, momentum uniform 0..0.9), and that script with `--seed`: best validation accuracy,
  optimizer steps and wall seconds of each.

Trials run one at a time (`--parallel 1`), so decisions do not depend on timing and each
trial has the machine's cores. Prints one JSON line per measurement and a summary line per
part. The trials read MNIST from `TRAINRUN_DATA_DIR` (or trainrun's cache), as any run does:

    export TRAINRUN_DATA_DIR=../shared/data/mnist TRAINRUN_OFFLINE=1
    python3 benches/sweep_targets.py --trainrun target/release/trainrun --out /tmp/targets \\
        --part grid --seeds 0,1,2,3,4
    python3 benches/sweep_targets.py ... --part tpe --optuna-python /path/to/python-with-optuna
    python3 benches/sweep_targets.py ... --part tpe --grace 3 --no-optuna   # trainrun's side alone
"""

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ASHA = os.path.join(ROOT, "specs", "mnist_asha.toml")

SCHEDULER = '\n[sweep.scheduler]\nkind = "{kind}"\ngrace = {grace}\nreduction_factor = {eta}\n'
TPE = """
[sweep.random]
samples = 27

[sweep.random.parameters]
"optimizer.learning_rate" = { kind = "log_uniform", low = 0.003, high = 0.03 }
"batch.global" = { kind = "choice", values = [32, 64, 128] }
"optimizer.momentum" = { kind = "uniform", low = 0.0, high = 0.9 }

[sweep.tpe]
n_startup_trials = 9
"""


def scheduler(a, kind):
    """The `[sweep.scheduler]` table of `kind` with the command line's grace and η."""
    return SCHEDULER.format(kind=kind, eta=a.reduction_factor, grace=a.grace)


def spec_variant(out, name, sweep_tail, keep_grid=True):
    """`specs/mnist_asha.toml` with its `[sweep.scheduler]` (and, unless `keep_grid`, its grid)
    replaced by `sweep_tail`, written as `out/name.toml`."""
    text = open(ASHA).read()
    text = re.sub(r'^extends = "(.*)"$', lambda m: f'extends = "{os.path.join(ROOT, "specs", m.group(1))}"',
                  text, flags=re.M)
    text = text[: text.index("\n[sweep.scheduler]")] + "\n"
    if not keep_grid:
        text = text[: text.index("\n[sweep.grid]")] + "\n"
    path = os.path.join(out, f"{name}.toml")
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        f.write(text + sweep_tail)
    return path


RESIDENT = []


def sweep(trainrun, spec, folder, seed, steps_per_epoch=None, sets=()):
    """Runs `trainrun sweep` one trial at a time; returns its wall seconds."""
    started = time.perf_counter()
    epoch = ["--set", f"train.steps_per_epoch={steps_per_epoch}"] if steps_per_epoch else []
    epoch += RESIDENT + list(sets)
    subprocess.run(
        [trainrun, "sweep", spec, "-q", "--parallel", "1", "--set", f"run.out_dir={folder}",
         "--set", f"sweep.seed={seed}", *epoch],
        check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def prune(folder):
    """Deletes the weights and backups under `folder` (about 1 GB a sweep), keeping the records."""
    for here, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(here, f)
            if os.path.getsize(path) > 1 << 20:
                os.remove(path)


def rows(folder):
    with open(os.path.join(folder, "results.csv")) as f:
        return list(csv.DictReader(f))


def best(rows_, metric="val_accuracy"):
    """The best value among trials trained to the end (`ok`)."""
    return max(float(r[metric]) for r in rows_ if r["status"] == "ok" and r[metric])


def steps(rows_):
    return sum(int(r["steps"]) for r in rows_ if r["steps"])


def segments(trial_dir):
    """Each launch of a trial (its summary at each rung, then its last): (wall_s, seconds
    outside training steps)."""
    files = sorted((f for f in os.listdir(trial_dir) if re.fullmatch(r"rung-\d+\.json", f)),
                   key=lambda f: int(f[5:-5]))
    summaries = [json.load(open(os.path.join(trial_dir, f))) for f in files]
    last = os.path.join(trial_dir, "summary.json")
    if os.path.exists(last):
        s = json.load(open(last))
        if not summaries or summaries[-1]["steps"] != s["steps"]:
            summaries.append(s)
    out = []
    for s in summaries:
        trained = s["steps"] - (s.get("resumed_from_step") or 0)
        per_s = s.get("steady_examples_per_s") or 0
        batch = s["examples"] / s["steps"] if s["steps"] else 0
        stepping = trained * batch / per_s if per_s else 0.0
        out.append((s["wall_s"], max(s["wall_s"] - stepping, 0.0)))
    return out


def beyond(values, as_before):
    """What a trial's launches spent beyond what one launch trained straight through spends:
    beyond its first launch (which starts the process, loads the data, builds the model, and
    evaluates and writes once, as a trial without a scheduler does), or, `as_before`, beyond
    its cheapest launch. The two agree when every launch is a new process; with resident
    trials a later launch skips the start, so the cheapest one is a later launch and
    `as_before` counts each promoted trial's start as overhead (how figures before 2026-11-30
    were taken)."""
    return sum(values) - (min(values) if as_before else values[0])


def launches(folder):
    """Each launched trial's `segments` in `folder` (trials never launched left out)."""
    dirs = (os.path.join(folder, name) for name in sorted(os.listdir(folder)))
    return [seg for seg in (segments(d) for d in dirs if os.path.isdir(d)) if seg]


def overhead(folder, wall, as_before=False):
    """ASHA's scheduler overhead in `folder`: pause and resume time, and the driver's time
    between launches, in seconds."""
    trials_ = launches(folder)
    launched = sum(w for seg in trials_ for w, _ in seg)
    pause_resume = sum(beyond([o for _, o in seg], as_before) for seg in trials_)
    return pause_resume, max(wall - launched, 0.0)


def starts(folder, wall):
    """A sweep without a scheduler in `folder`, which launches each trial once: the seconds its
    driver spent per trial outside the trials' own launches (starting and reaping each trial
    process, rewriting `results.csv`). A scheduled sweep pays this once per trial too, so
    `overhead`'s driver time less it is what the scheduler added."""
    trials_ = launches(folder)
    launched = sum(w for seg in trials_ for w, _ in seg)
    return max(wall - launched, 0.0) / len(trials_) if trials_ else 0.0


def shares(pr, evals, driver, per_start, launched_trials, wall):
    """The overhead figures of one scheduled sweep: the share of its wall time that its pauses,
    resumes and the driver took (`overhead_pct`), that less the evaluations at the rungs, and
    the mechanism alone (`pause_resume_decision_pct`): pausing, resuming and deciding, without
    the evaluations at the rungs and without the trial starts a sweep with no scheduler pays
    too (`per_start` a trial, measured on such a sweep in the same sitting)."""
    decision = max(driver - per_start * launched_trials, 0.0)
    return {
        "pause_resume_s": round(pr, 2), "driver_s": round(driver, 2),
        "overhead_pct": round(100 * (pr + driver) / wall, 2),
        "rung_evaluation_s": round(evals, 2),
        "overhead_without_rung_evaluation_pct": round(100 * (pr - evals + driver) / wall, 2),
        "trial_start_ms": round(1000 * per_start, 1), "decision_s": round(decision, 2),
        "pause_resume_decision_pct": round(100 * (pr - evals + decision) / wall, 2),
    }


def rung_evaluations(folder, as_before=False):
    """Of `overhead`'s pause and resume time in `folder`, the seconds spent evaluating at the
    rungs: each launch's evaluation (its `evaluation` event's `wall_s` less the event's before
    it in `metrics.jsonl`), summed per trial beyond its first (`as_before`: its shortest), as
    `overhead` counts each trial's outside time. These are the decision's inputs, which every
    scheduler pays (Optuna's median pruner reads the same value at each rung)."""
    extra = 0.0
    for name in os.listdir(folder):
        path = os.path.join(folder, name, "metrics.jsonl")
        if not os.path.exists(path):
            continue
        events = [json.loads(line) for line in open(path) if line.strip()]
        took = [e["wall_s"] - events[i - 1]["wall_s"] for i, e in enumerate(events)
                if i > 0 and e.get("event") == "evaluation"]
        if took:
            extra += beyond(took, as_before)
    return extra


def resumes(folder):
    """Each promotion's resume, in seconds: from the launch (a resident trial's order) to its
    first step, as the launch's summary records it (`first_step_s`), for every launch that
    resumed from a backup."""
    out = []
    for name in sorted(os.listdir(folder)):
        d = os.path.join(folder, name)
        if not os.path.isdir(d):
            continue
        files = [f for f in os.listdir(d) if re.fullmatch(r"rung-\d+\.json", f) or f == "summary.json"]
        out += [s["first_step_s"] for s in (json.load(open(os.path.join(d, f))) for f in files)
                if s.get("resumed_from_step")]
    return out


def part_grid(a):
    results = []
    for seed in a.seeds:
        full_spec = spec_variant(a.out, "grid_full", "")
        full_dir = os.path.join(a.out, f"grid-full-{seed}")
        full_wall = sweep(a.trainrun, full_spec, full_dir, seed)
        asha_dir = os.path.join(a.out, f"grid-asha-{seed}")
        asha_wall = sweep(a.trainrun, ASHA, asha_dir, seed)
        full, asha = rows(full_dir), rows(asha_dir)
        pr, driver = overhead(asha_dir, asha_wall)
        evals = rung_evaluations(asha_dir)
        cost = shares(pr, evals, driver, starts(full_dir, full_wall), len(launches(asha_dir)), asha_wall)
        prune(full_dir)
        prune(asha_dir)
        r = {
            "part": "grid", "seed": seed,
            "grid_best_val_accuracy": best(full), "asha_best_val_accuracy": best(asha),
            "gap": best(full) - best(asha),
            "grid_steps": steps(full), "asha_steps": steps(asha), "asha_step_fraction": steps(asha) / steps(full),
            "grid_wall_s": round(full_wall, 1), "asha_wall_s": round(asha_wall, 1), **cost,
        }
        print(json.dumps(r), flush=True)
        results.append(r)
    within = sum(r["gap"] <= 0.005 for r in results)
    print(json.dumps({
        "part": "grid", "seeds": len(results), "within_0.5pct": within,
        "max_step_fraction": max(r["asha_step_fraction"] for r in results),
        "max_overhead_pct": max(r["overhead_pct"] for r in results),
        "max_pause_resume_decision_pct": max(r["pause_resume_decision_pct"] for r in results),
    }), flush=True)


def part_overhead(a):
    results = []
    plain_spec = spec_variant(a.out, "plain", "")
    for seed in a.seeds:
        # The same 27 trials without a scheduler, one epoch each: what starting a trial costs
        # the driver of any sweep (independent of the steps), in the same sitting.
        plain = os.path.join(a.out, f"overhead-plain-{seed}")
        plain_wall = sweep(a.trainrun, plain_spec, plain, seed, a.steps_per_epoch, ["--set", "train.epochs=1"])
        per_start = starts(plain, plain_wall)
        prune(plain)
        folder = os.path.join(a.out, f"overhead-{a.steps_per_epoch}-{seed}")
        wall = sweep(a.trainrun, ASHA, folder, seed, a.steps_per_epoch)
        ours = rows(folder)
        pr, driver = overhead(folder, wall)
        evals = rung_evaluations(folder)
        pr_before, _ = overhead(folder, wall, as_before=True)
        evals_before = rung_evaluations(folder, as_before=True)
        resumed = sorted(resumes(folder))
        prune(folder)
        r = {
            "part": "overhead", "seed": seed, "steps_per_epoch": a.steps_per_epoch,
            "asha_best_val_accuracy": best(ours), "asha_steps": steps(ours),
            "promotions": sum(1 for d in open(os.path.join(folder, "decisions.jsonl")) if '"promote"' in d),
            "asha_wall_s": round(wall, 1), **shares(pr, evals, driver, per_start, len(launches(folder)), wall),
            "overhead_pct_as_before": round(100 * (pr_before + driver) / wall, 2),
            "overhead_without_rung_evaluation_pct_as_before":
                round(100 * (pr_before - evals_before + driver) / wall, 2),
            "resume_ms_median": round(1000 * resumed[len(resumed) // 2], 1) if resumed else None,
        }
        print(json.dumps(r), flush=True)
        results.append(r)


def without_timing(path):
    table = list(csv.reader(open(path)))
    keep = [i for i, h in enumerate(table[0]) if h not in ("wall_s", "steady_examples_per_s")]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([[r[i] for i in keep] for r in table])
    return out.getvalue()


def part_sync(a):
    spec = spec_variant(a.out, "grid_halving", scheduler(a, "successive_halving"))
    seed = a.seeds[0]
    first, second = os.path.join(a.out, "sync-a"), os.path.join(a.out, "sync-b")
    walls = [sweep(a.trainrun, spec, d, seed) for d in (first, second)]
    files = [os.path.join(d, "results.csv") for d in (first, second)]
    same_bytes = open(files[0], "rb").read() == open(files[1], "rb").read()
    same_results = without_timing(files[0]) == without_timing(files[1])
    prune(first)
    prune(second)
    print(json.dumps({"part": "sync", "seed": seed, "byte_identical": same_bytes,
                      "identical_without_timing_columns": same_results,
                      "wall_s": [round(w, 1) for w in walls]}), flush=True)


def part_tpe(a):
    spec = spec_variant(a.out, "tpe_asha", TPE + scheduler(a, "asha"), keep_grid=False)
    results = []
    for seed in a.seeds:
        folder = os.path.join(a.out, f"tpe-asha-{seed}")
        wall = sweep(a.trainrun, spec, folder, seed)
        ours = rows(folder)
        prune(folder)
        started = time.perf_counter()
        theirs = {"best_val_accuracy": None, "total_steps": None, "pruned": None}
        if not a.no_optuna:
            optuna = subprocess.run(
                [a.optuna_python, os.path.join(HERE, "optuna_sweep.py"), "--trainrun", a.trainrun,
                 "--out", os.path.join(a.out, f"optuna-{seed}"), "--seed", str(seed)],
                check=True, capture_output=True, text=True)
            theirs = json.loads(optuna.stdout.strip().splitlines()[-1])
            prune(os.path.join(a.out, f"optuna-{seed}"))
        r = {
            "part": "tpe", "seed": seed,
            "trainrun_best_val_accuracy": best(ours), "optuna_best_val_accuracy": theirs["best_val_accuracy"],
            "trainrun_steps": steps(ours), "optuna_steps": theirs["total_steps"],
            "trainrun_wall_s": round(wall, 1),
            "optuna_wall_s": None if a.no_optuna else round(time.perf_counter() - started, 1),
            "optuna_pruned": theirs["pruned"],
        }
        print(json.dumps(r), flush=True)
        results.append(r)
    print(json.dumps({
        "part": "tpe", "seeds": len(results),
        "trainrun_equal_or_better": sum(r["optuna_best_val_accuracy"] is not None
                                        and r["trainrun_best_val_accuracy"] >= r["optuna_best_val_accuracy"]
                                        for r in results),
        "trainrun_steps": sum(r["trainrun_steps"] for r in results),
        "optuna_steps": None if a.no_optuna else sum(r["optuna_steps"] for r in results),
    }), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trainrun", default=os.path.join(ROOT, "target", "release", "trainrun"))
    p.add_argument("--out", required=True, help="a folder of its own")
    p.add_argument("--part", choices=["grid", "sync", "tpe", "overhead"], required=True)
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--steps-per-epoch", type=int, default=70, help="the rungs' epoch (for --part overhead)")
    p.add_argument("--resident-trials", type=int, default=None,
                   help="sets sweep.resident_trials (0: every trial exits at its rung, as before resident trials)")
    p.add_argument("--reduction-factor", type=int, default=3,
                   help="ASHA's and successive halving's η for --part tpe and sync "
                        "(--part grid keeps the spec's own)")
    p.add_argument("--grace", type=int, default=1, help="the first rung, in epochs, for --part tpe and sync")
    p.add_argument("--no-optuna", action="store_true",
                   help="--part tpe: trainrun's side only "
                        "(Optuna's figures are the same every run of the same trainrun)")
    p.add_argument("--optuna-python", default=sys.executable, help="a Python with optuna (for --part tpe)")
    a = p.parse_args()
    a.seeds = [int(s) for s in a.seeds.split(",")]
    a.trainrun = os.path.abspath(a.trainrun)
    if a.resident_trials is not None:
        RESIDENT.extend(["--set", f"sweep.resident_trials={a.resident_trials}"])
    {"grid": part_grid, "sync": part_sync, "tpe": part_tpe, "overhead": part_overhead}[a.part](a)


if __name__ == "__main__":
    main()
