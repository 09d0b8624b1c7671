"""Optuna reference for trainrun's sweep benchmark: TPE + MedianPruner driving trainrun trials.

The search of `specs/mnist_asha.toml` (learning rate, batch size and momentum of the tutorial
model, selected on the validation tenth of MNIST's training files), run by Optuna's Python API
instead of `trainrun sweep`: `TPESampler(seed=SEED, n_startup_trials=STARTUP)` suggests each
trial, which trains as an ordinary `trainrun SPEC` run rung by rung (1, 3, 9 epochs by default:
each rung resumes from the run's own backup), reporting its validation accuracy to
`MedianPruner` after each rung and stopping when the pruner says so. The spec's `[sweep]`
sections are left out of the run spec (a spec with a sweep is not a run). Run it with a Python
that has optuna:

    python3 -m venv /tmp/optuna && /tmp/optuna/bin/pip install optuna
    /tmp/optuna/bin/python benches/optuna_sweep.py --trainrun target/release/trainrun --out /tmp/o --seed 0

Prints one JSON line: the best validation accuracy and its parameters, the optimizer steps
trained in all (every rung of every trial, the compute trainrun's `results.csv` counts as
`steps`), the trials, how many were pruned, and the wall seconds.
"""

import argparse
import json
import os
import re
import subprocess
import time

import optuna


def run_spec(spec, out):
    """The spec without its [sweep] sections, its `extends` made absolute, written under `out`."""
    text = open(spec).read()
    cut = text.find("\n[sweep")
    text = text if cut < 0 else text[:cut] + "\n"
    here = os.path.dirname(os.path.abspath(spec))
    text = re.sub(r'^extends = "(.*)"$', lambda m: f'extends = "{os.path.join(here, m.group(1))}"', text, flags=re.M)
    path = os.path.join(out, "run.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trainrun", default="target/release/trainrun")
    p.add_argument("--spec", default="specs/mnist_asha.toml")
    p.add_argument("--out", required=True, help="a folder of its own for the trials")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trials", type=int, default=27)
    p.add_argument("--startup", type=int, default=9, help="random trials before TPE, and before the pruner stops any")
    p.add_argument("--rungs", default="1,3,9", help="epochs after which a trial reports and may be pruned")
    p.add_argument("--steps-per-epoch", type=int, default=20, help="the spec's train.steps_per_epoch")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    spec = run_spec(args.spec, args.out)
    rungs = [int(r) for r in args.rungs.split(",")]
    steps = {"total": 0}

    def objective(trial):
        lr = trial.suggest_float("optimizer.learning_rate", 0.003, 0.03, log=True)
        batch = trial.suggest_categorical("batch.global", [32, 64, 128])
        momentum = trial.suggest_float("optimizer.momentum", 0.0, 0.9)
        folder = os.path.join(args.out, f"trial-{trial.number:03d}")
        sets = {
            "run.out_dir": folder,
            "run.seed": args.seed * 1000 + trial.number,
            "optimizer.learning_rate": lr,
            "batch.global": batch,
            "optimizer.momentum": momentum,
        }
        trained, value = 0, None
        for epochs in rungs:
            cmd = [args.trainrun, spec, "-q", "--set", f"train.epochs={epochs}"]
            for k, v in sets.items():
                cmd += ["--set", f"{k}={v}"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            steps["total"] += (epochs - trained) * args.steps_per_epoch
            trained = epochs
            with open(os.path.join(folder, "summary.json")) as f:
                # A run names the split it evaluates `test_*`: here the validation tenth.
                value = json.load(f)["test_accuracy"]
            trial.report(value, epochs)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return value

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=args.startup)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=args.startup)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    started = time.perf_counter()
    study.optimize(objective, n_trials=args.trials)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    print(
        json.dumps(
            {
                "best_val_accuracy": study.best_value,
                "best_params": study.best_params,
                "total_steps": steps["total"],
                "trials": len(study.trials),
                "pruned": pruned,
                "wall_s": round(time.perf_counter() - started, 1),
                "optuna": optuna.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
