//! The plan as `trainrun check` prints it: one line per decision, with the arithmetic shown.

use super::{
    CallbackKind, CollectivePlan, CrossDevice, CrossDevicePlan, Distribution, Part, Plan, SaveEvery, Scaling, Schedule,
    ShardPolicy,
};
use crate::cluster::Address;
use crate::collective::choice::SizeChoice;
use crate::collective::cost::LinkCost;
use crate::collective::{Algorithm, TransportKind};
use crate::data::{LabelKind, Shuffle};
use std::fmt::Write;

/// `n word` in English: "1 epoch", "2 epochs", "2 test batches" ("-tch" and "-s" take "es";
/// "epoch" does not, though it ends in "ch").
fn plural(n: impl Into<u64>, word: &str) -> String {
    let n = n.into();
    let ending = match (n, word.ends_with("tch") || word.ends_with('s')) {
        (1, _) => "",
        (_, true) => "es",
        (_, false) => "s",
    };
    format!("{n} {word}{ending}")
}

fn freq(f: SaveEvery) -> String {
    match f {
        SaveEvery::Epoch => "every epoch".to_string(),
        SaveEvery::Steps(n) => format!("every {}", plural(n.get(), "step")),
    }
}

fn bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// Rows of `key  value`.
type Rows = Vec<(&'static str, String)>;

/// Renders `plan` as aligned `key  value` lines.
pub fn text(plan: &Plan) -> String {
    let mut rows: Rows = vec![("strategy", plan.strategy.kind().name().to_string())];
    for section in [
        cluster,
        replicas,
        batch_and_learning_rate,
        steps_and_data,
        reduction,
        parameter_servers,
        evaluation,
        callbacks,
    ] {
        section(plan, &mut rows);
    }
    if let Some(memory) = &plan.memory {
        rows.push(("memory", memory.summary()));
    }
    if !plan.precision.is_float32() {
        rows.push(("precision", plan.precision.summary()));
    }
    rows.push(("threads", format!("{} per task", plan.threads)));
    rows.push(("cpu", crate::engine::tuning::Tuning::here().describe()));
    rows.push(("output", plan.out_dir.display().to_string()));

    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = format!("plan for {} (seed {})\n", plan.name, plan.seed);
    for (k, v) in rows {
        let _ = writeln!(out, "  {k:<width$}  {v}");
    }
    out
}

/// The cluster, the chief and what this process does.
fn cluster(plan: &Plan, rows: &mut Rows) {
    let c = &plan.cluster;
    if !c.tasks.is_empty() {
        let at = |a: &Address| match a {
            Address::Local => "a free local port".to_string(),
            Address::At(a) => a.clone(),
        };
        let tasks: Vec<String> = c.tasks.iter().map(|(t, a)| format!("{t} on {}", at(a))).collect();
        rows.push(("cluster", format!("{} (from {})", tasks.join(", "), c.source.describe())));
        rows.push(("chief", c.chief.map_or_else(|| "none".into(), |t| t.to_string())));
        let this = match c.part {
            Part::Task(t) => t.to_string(),
            Part::Launcher => format!("launcher: starts and supervises the {} local tasks", c.tasks.len()),
            // A one-process strategy inside a cluster's task still names it.
            Part::Single => c.task.map_or_else(|| "the only task".into(), |t| t.to_string()),
        };
        rows.push(("this process", this));
    }
}

/// Devices and replicas.
fn replicas(plan: &Plan, rows: &mut Rows) {
    let s = &plan.strategy;
    let devices: Vec<String> = s.devices.iter().map(ToString::to_string).collect();
    rows.push(("devices", format!("{} per worker", devices.join(", "))));
    rows.push(("num_replicas_in_sync", format!("{} ({})", s.num_replicas_in_sync, s.replicas_text())));
}

/// The batch arithmetic, the learning rate, warmup, schedule and optimizer.
fn batch_and_learning_rate(plan: &Plan, rows: &mut Rows) {
    let s = &plan.strategy;
    let b = &plan.batch;
    let derived = match b.derived {
        super::Derived::Global => "global derived",
        super::Derived::PerReplica => "per_replica derived",
        super::Derived::AccumulationSteps => "accumulation_steps derived",
        super::Derived::Nothing => "all three given",
    };
    rows.push((
        "batch",
        format!(
            "global {} = per_replica {} × {} × {} ({derived})",
            b.global,
            b.per_replica,
            plural(s.num_replicas_in_sync as u64, "replica"),
            plural(b.accumulation_steps as u64, "accumulation step"),
        ),
    ));
    let lr = &plan.learning_rate;
    let scaling = match lr.scaling {
        Scaling::Linear { base_batch } => format!("linear: {} × {} / {base_batch}", lr.base, b.global),
        Scaling::Sqrt { base_batch } => format!("sqrt: {} × sqrt({} / {base_batch})", lr.base, b.global),
        Scaling::Table => format!("table entry for batch {}", b.global),
        Scaling::None => "no scaling".to_string(),
    };
    rows.push(("learning_rate", format!("{} ({scaling})", fmt_f(lr.scaled))));
    rows.push((
        "warmup",
        match lr.warmup {
            Some(w) => format!("{} linear from {} to {}", plural(w.steps, "step"), fmt_f(w.start), fmt_f(lr.scaled)),
            None => "none".to_string(),
        },
    ));
    rows.push((
        "schedule",
        match lr.schedule {
            Schedule::Constant => "constant".to_string(),
            Schedule::StepDecay { factor, every_steps } => format!("× {factor} every {}", plural(every_steps, "step")),
            Schedule::Cosine { alpha, total_steps } if alpha == 0.0 => format!("cosine to 0 at step {total_steps}"),
            Schedule::Cosine { alpha, total_steps } => {
                format!("cosine to {} ({} × peak) at step {total_steps}", fmt_f(alpha * lr.scaled), fmt_f(alpha))
            }
        },
    ));
    rows.push((
        "optimizer",
        match plan.optimizer {
            super::OptimizerPlan::Sgd { momentum, nesterov, weight_decay, clip_norm } => {
                format!(
                    "sgd, momentum {momentum}{}, weight decay {weight_decay}{}",
                    if nesterov { " (nesterov)" } else { "" },
                    clip(clip_norm)
                )
            }
            super::OptimizerPlan::Adam { beta_1, beta_2, epsilon, weight_decay, decoupled, clip_norm, ref decay } => {
                let on = match decay {
                    super::DecayPlan::All => String::new(),
                    super::DecayPlan::Matrices => " (matrices only)".to_string(),
                    super::DecayPlan::Excluding(p) => format!(" (except {})", p.join(", ")),
                };
                format!(
                    "{}, beta_1 {beta_1}, beta_2 {beta_2}, epsilon {epsilon}, weight decay {weight_decay}{on}{}",
                    if decoupled { "adamw" } else { "adam" },
                    clip(clip_norm)
                )
            }
        },
    ));
}

/// `, clip_norm N` when clipping.
fn clip(clip_norm: Option<f64>) -> String {
    clip_norm.map_or(String::new(), |c| format!(", clip_norm {c}"))
}

/// Steps, data and the input pipeline.
fn steps_and_data(plan: &Plan, rows: &mut Rows) {
    let b = &plan.batch;
    let t = &plan.train;
    rows.push((
        "steps",
        format!(
            "{} × {} = {} ({} examples per step)",
            plural(t.epochs, "epoch"),
            plural(t.steps_per_epoch, "step"),
            plural(t.total_steps, "step"),
            b.global
        ),
    ));
    let d = &plan.data;
    let shape: Vec<String> = d.facts.example_shape.iter().map(|v| v.to_string()).collect();
    let labels = match d.facts.labels {
        LabelKind::Class { classes } => format!("{classes} classes"),
        LabelKind::Target { width } => format!("{width} float target{}", if width == 1 { "" } else { "s" }),
        LabelKind::Sequence { classes, len } => format!("{classes} classes at each of {len} positions"),
    };
    rows.push((
        "data",
        format!(
            "{}: {} train / {} test examples of {}, {labels}",
            d.source.name(),
            d.facts.train_examples,
            d.facts.test_examples,
            shape.join("×"),
        )
        .to_lowercase(),
    ));
    let shuffle = match d.shuffle {
        Shuffle::Full => "full shuffle each epoch".to_string(),
        Shuffle::Off => "no shuffle".to_string(),
        Shuffle::Buffer(n) => format!("shuffle buffer of {n}"),
    };
    let shards = match d.shard {
        ShardPolicy::None => "one shard".to_string(),
        ShardPolicy::File => format!("file policy, {} shards", d.num_shards),
        ShardPolicy::Data => {
            format!("data policy: worker i keeps every {} example of each global batch", ordinal(d.num_shards))
        }
        ShardPolicy::Off => format!("off: all {} workers read everything", d.num_shards),
    };
    let remainder = if d.drop_remainder { "drop remainder" } else { "keep partial batches" };
    rows.push(("input", format!("{shuffle}, {remainder}, prefetch {}, {shards}", d.prefetch)));
    if let Some(steps) = d.preprocessing.describe() {
        rows.push(("preprocessing", steps));
    }
}

/// How gradients are reduced.
fn reduction(plan: &Plan, rows: &mut Rows) {
    let s = &plan.strategy;
    rows.push((
        "all-reduce",
        match &s.distribution {
            Distribution::Default | Distribution::OneDevice => "none (one replica)".to_string(),
            Distribution::Mirrored(CrossDevicePlan { algorithm, auto }) => {
                let why = if *algorithm == CrossDevice::Nccl { "GPU devices" } else { "CPU devices" };
                if *auto { format!("{} (auto: {why})", algorithm.name()) } else { algorithm.name().to_string() }
            }
            Distribution::CentralStorage => CrossDevice::ReductionToOneDevice.name().to_string(),
            Distribution::MultiWorkerMirrored(cp) => {
                let how = format!("{} over {}", cp.algorithm.describe(), cp.transport.describe());
                let how = match (cp.auto, cp.auto_transport) {
                    (true, true) => format!("{how}; both chosen by auto"),
                    (true, false) => format!("{how}; the algorithm chosen by auto"),
                    (false, true) => format!("{how}; the transport chosen by auto"),
                    (false, false) => how,
                };
                let how = match s.devices.len() {
                    1 => how,
                    // Several devices per worker: TensorFlow's hierarchical all-reduce.
                    d => format!("hierarchical: the {d} local replicas summed on the first, then {how}, then shared"),
                };
                format!(
                    "{how}; packs of {}, timeout {} s",
                    bytes(cp.bytes_per_pack.get() as u64),
                    plan.cluster.timeout.as_secs_f64()
                )
            }
            Distribution::ParameterServer(_) => "parameter servers (asynchronous)".to_string(),
        },
    ));
    if let Distribution::MultiWorkerMirrored(cp) = &s.distribution {
        topology(cp, plan.model.params as u64, rows);
    }
}

/// The workers' hosts, how `hierarchical` groups them, the cost model's estimates, and under
/// `auto` the algorithm each of the `floats` gradients' pack sizes takes.
fn topology(cp: &CollectivePlan, floats: u64, rows: &mut Rows) {
    let hosts: Vec<String> = cp
        .topology
        .hosts
        .iter()
        .map(|h| {
            let workers: Vec<String> = h.workers.iter().map(ToString::to_string).collect();
            format!("{} ({})", h.name, workers.join(", "))
        })
        .collect();
    rows.push(("hosts", format!("{}: {}", plural(hosts.len() as u64, "host"), hosts.join("; "))));
    if cp.algorithm == Algorithm::Hierarchical {
        let leaders: Vec<String> =
            cp.topology.hosts.iter().filter_map(|h| h.workers.first()).map(ToString::to_string).collect();
        rows.push((
            "groups",
            format!(
                "each host's workers sum among themselves, then its leader among the leaders {}",
                leaders.join(", ")
            ),
        ));
    }
    let m = &cp.cost_model;
    let link = |l: &LinkCost| format!("α {} µs, {:.2} GB/s", l.alpha * 1e6, 1e-9 / l.beta);
    rows.push((
        "cost model",
        format!(
            "network {}; shared memory {}; sums {:.2} GB/s",
            link(&m.network),
            link(&m.shared_memory),
            1e-9 / m.gamma
        ),
    ));
    let estimates: Vec<String> = cp
        .estimates
        .iter()
        .map(|(a, secs)| {
            let chosen = if *a == cp.algorithm { " (chosen)" } else { "" };
            format!("{} {:.3} ms{chosen}", a.name(), secs * 1e3)
        })
        .collect();
    rows.push((
        "estimates",
        format!(
            "per pack of {} among {}: {}",
            bytes(cp.bytes_per_pack.get() as u64),
            plural(cp.topology.workers() as u64, "worker"),
            estimates.join(", ")
        ),
    ));
    let Some(auto) = cp.auto_by_size(floats) else { return };
    let choice = SizeChoice::over(auto.model, cp.transport, auto.placement);
    if !choice.chooses() {
        return;
    }
    let picks: Vec<String> = SizeChoice::packs(floats, cp.bytes_per_pack.get())
        .into_iter()
        .map(|(b, n)| format!("{} × {} → {}", plural(n, "pack"), bytes(b as u64), choice.pick(b).name()))
        .collect();
    let model = if auto.measure {
        "the model measured at start-up (these figures until then; an earlier run's if it kept them)"
    } else {
        "the spec's model"
    };
    rows.push(("by pack size", format!("{}, by {model}", picks.join("; "))));
}

/// Under `parameter_server`: the coordinator's settings, where every variable or shard lives
/// and the bytes per ps.
fn parameter_servers(plan: &Plan, rows: &mut Rows) {
    let Distribution::ParameterServer(ps) = &plan.strategy.distribution else { return };
    let staleness = match ps.max_staleness {
        None => "unbounded staleness (fully asynchronous)".to_string(),
        Some(s) => format!("max_staleness {s}: a worker {} ahead of the slowest waits", plural(s + 1, "step")),
    };
    rows.push((
        "coordinator",
        format!(
            "queue of {}, {}, {} per closure",
            plural(ps.queue_size.get() as u64, "closure"),
            staleness,
            plural(ps.steps_per_execution.get(), "step")
        ),
    ));
    let plane = match (ps.transport, ps.auto_transport) {
        (TransportKind::SharedMemory, true) => "shared memory between a worker and a ps on one host, else TCP",
        (TransportKind::SharedMemory, false) => "shared memory (every worker on its ps tasks' host)",
        (
            TransportKind::Tcp
            | TransportKind::TcpTls
            | TransportKind::SharedMemoryAndTcp
            | TransportKind::SharedMemoryAndTcpTls,
            _,
        ) => "TCP",
    };
    rows.push(("data plane", format!("pulls and pushes through {plane}; requests over TCP")));
    rows.push((
        "evaluation",
        format!("the chief evaluates with {} while the workers wait", plural(ps.eval_threads as u64, "thread")),
    ));
    rows.push((
        "worker input",
        "each worker reads its own shuffle: async training visits examples at least once per epoch, not exactly once"
            .to_string(),
    ));
    for (i, v) in ps.variables.iter().enumerate() {
        let shape: Vec<String> = v.shape.iter().map(ToString::to_string).collect();
        let at = match v.shards.as_slice() {
            [one] => format!("ps {}", one.ps),
            shards => {
                let each: Vec<String> =
                    shards.iter().map(|s| format!("rows {}..{} on ps {}", s.start, s.start + s.rows, s.ps)).collect();
                format!("{} shards: {}", shards.len(), each.join(", "))
            }
        };
        let kind = if v.trainable { "" } else { " (not trained)" };
        rows.push((if i == 0 { "placement" } else { "" }, format!("{} [{}]{kind} → {at}", v.name, shape.join(", "))));
    }
    let per_ps: Vec<String> =
        ps.bytes_per_ps.iter().enumerate().map(|(i, b)| format!("ps {i}: {}", bytes_exact(*b))).collect();
    rows.push(("bytes per ps", format!("{} (optimizer slots on top)", per_ps.join(", "))));
}

/// Bytes in the largest unit that keeps one decimal honest.
fn bytes_exact(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB ({n} B)", n as f64 / f64::from(1u32 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1} KiB ({n} B)", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// When the test split is evaluated.
fn evaluation(plan: &Plan, rows: &mut Rows) {
    let (t, d) = (&plan.train, &plan.data);
    rows.push((
        "evaluation",
        match t.eval {
            None => "none (no test split)".to_string(),
            Some(e) => {
                let mut when = Vec::new();
                if e.every_epoch {
                    when.push("every epoch".to_string());
                }
                if let Some(n) = e.every_steps {
                    when.push(format!("every {}", plural(n, "step")));
                }
                when.push("at the end".to_string());
                let on = e
                    .validation_steps
                    .map_or(format!("{} test examples", d.facts.test_examples), |v| plural(v, "test batch"));
                format!("{} on {on}", when.join(", "))
            }
        },
    ));
}

/// Checkpoints, restarts and the other callbacks.
fn callbacks(plan: &Plan, rows: &mut Rows) {
    let mut checkpoints = Vec::new();
    let mut others = Vec::new();
    for cb in &plan.callbacks.items {
        match &cb.kind {
            CallbackKind::ModelCheckpoint { every, best_only, max_to_keep, .. } => {
                let mut c = format!("model_checkpoint {}", freq(*every));
                if best_only.is_some() {
                    c.push_str(", best only");
                }
                if let Some(k) = max_to_keep {
                    c.push_str(&format!(", keep {k}"));
                }
                checkpoints.push(c);
            }
            CallbackKind::BackupAndRestore { every, .. } => {
                checkpoints.push(format!("backup_and_restore {}", freq(*every)))
            }
            CallbackKind::EarlyStopping { watch, patience, .. } => {
                others.push(format!("early_stopping on {} (patience {patience})", watch.monitor.name()))
            }
            CallbackKind::ReduceLrOnPlateau { watch, factor, patience, .. } => {
                others.push(format!("reduce_lr_on_plateau on {} (× {factor} after {patience})", watch.monitor.name()))
            }
            CallbackKind::CsvLogger { path, .. } => {
                others.push(format!("csv_logger to {}", path.strip_prefix(&plan.out_dir).unwrap_or(path).display()))
            }
            CallbackKind::StopAtTarget { monitor, target } => {
                others.push(format!("stop when {} reaches {target}", monitor.name()))
            }
        }
    }
    rows.push(("checkpoints", if checkpoints.is_empty() { "none".to_string() } else { checkpoints.join("; ") }));
    if plan.cluster.part == Part::Launcher {
        let r = plan.cluster.restarts;
        rows.push((
            "restarts",
            match r.max_restarts {
                0 => "none: a failed task ends the job".to_string(),
                n => format!(
                    "up to {n} of every task, from the last backup (wait {} s, doubling)",
                    r.backoff.as_secs_f64()
                ),
            },
        ));
    }
    if !others.is_empty() {
        rows.push(("callbacks", others.join("; ")));
    }
}

/// A float without noise digits.
fn fmt_f(v: f64) -> String {
    let s = format!("{v:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `2nd`, `3rd`, `11th`, `21st`: English ordinals for shard counts.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::{ordinal, plural};

    #[test]
    fn ordinals_read_as_english() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 103, 111].into_iter().map(ordinal).collect();
        assert_eq!(got, ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "103rd", "111th"]);
    }

    #[test]
    fn plurals_read_as_english() {
        let got: Vec<String> = [(1, "epoch"), (24, "epoch"), (3, "test batch"), (2, "step")]
            .into_iter()
            .map(|(n, word)| plural(n as u64, word))
            .collect();
        assert_eq!(got, ["1 epoch", "24 epochs", "3 test batches", "2 steps"]);
    }
}
