//! `trainrun SPEC`, the edge where I/O happens: prepare (load and plan), build the running job
//! from the plan, fit, and record the run folder. A local cluster's launcher starts the task
//! processes instead; an evaluator task evaluates checkpoints.

mod check;
mod eval;
mod export;
mod lock;
mod parameter_server;
pub(crate) mod predict;
mod run_folder;
mod sample;
mod tokenize;

pub use check::check;
pub use eval::eval;
pub use export::export;
pub use predict::{PredictOptions, batch_size as predict_batch_size, predict};
pub use sample::{SampleOptions, sample};
pub use tokenize::tokenize;

use crate::builder::{self, Resources};
use crate::cluster::job::{self, DataPlaneKind, Job, JobConfig};
use crate::cluster::tls::TlsMaterial;
use crate::cluster::{Address, Cluster, Role, TaskId, launch, resolve_token};
use crate::collective::{Algorithm, TransportKind};
use crate::data::{Dataset, Fetcher, Normalization};
use crate::exit::RunError;
use crate::plan::{Distribution, Part, Plan, StrategyKind};
use crate::prepare::{Invocation, Prepared, flag, prepare_to_train};
use crate::progress::ProgressMode;
use crate::sweep::resident::DriverOrder;
use crate::train::{self, FitOptions};
use run_folder::RunFolder;
use std::collections::BTreeMap;
use std::sync::Arc;

/// `trainrun SPEC`: trains (or launches the tasks that train) and writes the run folder.
pub fn train(inv: &Invocation) -> Result<(), RunError> {
    // Before anything else, so that no stop request finds the default action (death).
    crate::signals::stop_requested();
    let p = prepare_to_train(inv)?;
    if p.loaded.spec.sweep.is_some() {
        return Err(crate::sweep::not_a_run(&inv.spec, &p.loaded));
    }
    // Refused before any process starts, not from inside every task.
    crate::strategy::runnable(&p.plan)?;
    let parameter_servers = match &p.plan.strategy.distribution {
        Distribution::ParameterServer(ps) => Some(ps),
        Distribution::Default
        | Distribution::OneDevice
        | Distribution::Mirrored(_)
        | Distribution::CentralStorage
        | Distribution::MultiWorkerMirrored(_) => None,
    };
    match (p.plan.cluster.part, parameter_servers) {
        (Part::Launcher, _) => launch(inv, &p),
        (Part::Task(task), _) if task.role == Role::Evaluator => eval::sidecar(inv, &p, task),
        (Part::Task(task), Some(ps)) if task.role == Role::Ps => parameter_server::ps(inv, &p, ps, task),
        (Part::Task(task), Some(ps)) if task.role == Role::Worker => parameter_server::worker(inv, &p, ps, task),
        // The chief of a parameter-server job trains through the same loop: its strategy
        // schedules the steps on the workers.
        (Part::Single | Part::Task(_), _) => train_here(inv, &p),
    }
}

/// Whether this process locks the run folder: a single process, the local launcher (whose
/// tasks write the folder under its lock), or the chief of a job started task by task.
fn owns_run_folder(inv: &Invocation, p: &Prepared) -> bool {
    match p.plan.cluster.part {
        Part::Single | Part::Launcher => true,
        Part::Task(task) => {
            let launched = inv.env.iter().any(|(k, _)| k == launch::CONTROL_FD);
            Some(task) == p.plan.cluster.chief && !launched
        }
    }
}

/// Locks the run folder when this process owns it (see [`lock`]): held until it ends.
fn lock_run_folder(inv: &Invocation, p: &Prepared) -> Result<Option<lock::RunLock>, RunError> {
    if owns_run_folder(inv, p) { lock::acquire(p).map(Some) } else { Ok(None) }
}

/// Prints a line unless quiet.
fn say(quiet: bool, prefix: &str, text: &str) {
    if !quiet {
        eprintln!("{prefix}{text}");
    }
}

/// `FILE.partial-<pid>` beside `FILE`: outputs are written whole under it and renamed into
/// place, so no reader ever sees half a file under the final name.
pub(super) fn partial_beside(file: &std::path::Path) -> std::path::PathBuf {
    let mut name = file.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".partial-{}", std::process::id()));
    file.with_file_name(name)
}

/// A pool of `threads` compute threads.
pub(super) fn pool(threads: usize) -> Result<rayon::ThreadPool, RunError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| RunError::Failure(format!("cannot start {threads} threads: {e}")))
}

/// Fetches what is missing (unless `TRAINRUN_OFFLINE`, as HF_HUB_OFFLINE: then missing files
/// are an error naming them and the folder to put them in) and loads the data.
pub(super) fn load_data(inv: &Invocation, plan: &Plan) -> Result<Dataset, RunError> {
    load_preprocessed(inv, plan).map(|(dataset, _)| dataset)
}

/// [`load_data`], also returning the statistics `normalize = "adapt"` computed (for
/// `run.json`).
fn load_preprocessed(inv: &Invocation, plan: &Plan) -> Result<(Dataset, Option<Normalization>), RunError> {
    Ok(plan.data.preprocessing.apply(load_raw(inv, plan)?, plan.seed)?)
}

/// The data as the source loads it, before `[data.preprocessing]`.
pub(super) fn load_raw(inv: &Invocation, plan: &Plan) -> Result<Dataset, RunError> {
    if !flag(&inv.env, "TRAINRUN_OFFLINE") {
        plan.data.source.fetch_missing(&Fetcher::default())?;
    }
    Ok(plan.data.source.load()?)
}

fn progress_mode(inv: &Invocation) -> ProgressMode {
    match inv.env.iter().find(|(k, _)| k == "TRAINRUN_PROGRESS").map(|(_, v)| v.as_str()) {
        Some("events") => ProgressMode::Events,
        Some("quiet") => ProgressMode::Quiet,
        _ => ProgressMode::detect(inv.quiet),
    }
}

/// Starts every task of the local cluster as a process of this binary and supervises them.
fn launch(inv: &Invocation, p: &Prepared) -> Result<(), RunError> {
    // Before any task starts: the tasks write the folder under the launcher's lock.
    let _lock = lock_run_folder(inv, p)?;
    let mut args = vec![inv.spec.display().to_string()];
    for s in &inv.sets {
        args.extend(["--set".to_string(), s.clone()]);
    }
    let run = launcher(inv, &p.plan, args)?;
    if let Err(e) = launch::run(run) {
        let error = match e {
            launch::LaunchError::Preempted(_) => RunError::Preempted(e.to_string()),
            launch::LaunchError::Interrupted(_) => RunError::Interrupted(e.to_string()),
            e => RunError::Launch(e),
        };
        match error {
            RunError::Preempted(_) => {}
            // The chief saw SIGTERM from the launcher (or was killed by a second Ctrl-C).
            RunError::Interrupted(_) => crate::train::run_json::mark_interrupted(&p.plan.out_dir, &error.to_string()),
            // A chief killed before it could say so leaves `run.json` at `running`.
            _ => crate::train::run_json::mark_failed(&p.plan.out_dir, error.exit(), &error.to_string()),
        }
        return Err(error);
    }
    if !inv.quiet {
        println!("wrote {}", p.plan.out_dir.display());
    }
    Ok(())
}

/// The launcher of the plan's local cluster, starting this binary with `args` for each task,
/// as training runs it.
pub(super) fn launcher(inv: &Invocation, plan: &Plan, args: Vec<String>) -> Result<launch::Launch, RunError> {
    let exe =
        std::env::current_exe().map_err(|e| RunError::Failure(format!("cannot find the trainrun binary: {e}")))?;
    let c = &plan.cluster;
    Ok(launch::Launch {
        exe,
        args,
        cluster: Cluster { source: c.source, tasks: c.tasks.iter().cloned().collect() },
        grace: c.timeout + std::time::Duration::from_secs(2),
        progress: ProgressMode::detect(inv.quiet),
        epochs: plan.train.epochs,
        max_restarts: c.restarts.max_restarts,
        restart_backoff: c.restarts.backoff,
        stop: crate::signals::supervise(),
        expendable: expendable(plan.strategy.kind()),
        backs_up: plan.callbacks.backs_up(),
    })
}

/// The roles whose tasks the job survives losing, and that the launcher restarts on their
/// own: workers under `parameter_server`, whose closures the coordinator runs again elsewhere
/// (TensorFlow's `ClusterCoordinator` waits for a restarted worker and gives it work again).
fn expendable(kind: StrategyKind) -> Vec<Role> {
    match kind {
        StrategyKind::ParameterServer => vec![Role::Worker],
        StrategyKind::Default
        | StrategyKind::OneDevice
        | StrategyKind::Mirrored
        | StrategyKind::CentralStorage
        | StrategyKind::MultiWorkerMirrored => Vec::new(),
    }
}

/// Joins the job as `task`: control plane, rendezvous, and the data plane sized for
/// `arena_floats` gradient values.
pub(super) fn join(inv: &Invocation, plan: &Plan, task: TaskId, arena_floats: usize) -> Result<Job, RunError> {
    let mut addresses = BTreeMap::new();
    for (t, a) in &plan.cluster.tasks {
        match a {
            Address::At(a) => addresses.insert(*t, a.clone()),
            Address::Local => {
                return Err(RunError::Usage(format!(
                    "{t} has no address: a count of local tasks is started by `trainrun SPEC` itself; run without \
                     --task / TRAINRUN_TASK, or list host:port addresses in [cluster]"
                )));
            }
        };
    }
    let env_token = inv.env.iter().find(|(k, _)| k == "TRAINRUN_JOB_TOKEN").map(|(_, v)| v.as_str());
    let token =
        resolve_token(env_token, plan.cluster.token_file.as_deref()).map_err(|e| RunError::Cluster(e.to_string()))?;
    let tls = match &plan.cluster.tls {
        None => None,
        Some(files) => Some(Arc::new(TlsMaterial::load(files.clone()).map_err(|e| RunError::Cluster(e.to_string()))?)),
    };
    let data_plane = match &plan.strategy.distribution {
        Distribution::MultiWorkerMirrored(c) => DataPlaneKind::AllReduce {
            algorithm: c.algorithm,
            transport: c.transport,
            auto: c.auto_by_size(plan.model.params as u64),
        },
        Distribution::ParameterServer(_) => DataPlaneKind::Endpoints,
        // One replica per task: a world of one, whose all-reduce moves nothing.
        Distribution::Default | Distribution::OneDevice | Distribution::Mirrored(_) | Distribution::CentralStorage => {
            DataPlaneKind::AllReduce { algorithm: Algorithm::Ring, transport: TransportKind::Tcp, auto: None }
        }
    };
    job::join(JobConfig {
        task,
        addresses,
        token,
        // Only what changes the results must agree: `summary.json`'s `spec_sha256`.
        spec_hash: plan.hashes.results.clone(),
        spec_keys: plan.hashes.results_keys.clone(),
        tls,
        startup: plan.cluster.startup_timeout,
        timeout: plan.cluster.timeout,
        data_plane,
        arena_floats,
        expendable: expendable(plan.strategy.kind()),
        control: inherited_control(inv, plan, task),
    })
    .map_err(RunError::from)
}

/// The control-plane listener the local launcher bound for `task` and handed down.
fn inherited_control(inv: &Invocation, plan: &Plan, task: TaskId) -> Option<std::net::TcpListener> {
    let fd = inv.env.iter().find(|(k, _)| k == launch::CONTROL_FD).map(|(_, v)| v.as_str())?;
    let address = match plan.cluster.tasks.iter().find(|(t, _)| *t == task) {
        Some((_, Address::At(a))) => a,
        Some((_, Address::Local)) | None => return None,
    };
    launch::inherited_listener(fd, address)
}

/// A stop that came from Ctrl-C is an interruption (exit code 130), not a preemption.
pub(super) fn interrupted(e: RunError) -> RunError {
    match (e, crate::signals::received()) {
        (RunError::Preempted(text), Some(crate::signals::Stop::Interrupted)) => {
            RunError::Interrupted(text.replacen("preempted", "interrupted by Ctrl-C", 1))
        }
        (e, _) => e,
    }
}

/// Writes what maps a model's outputs back to the data into the run folder: `vocab.json` (a
/// text model's token ids) or `classes.json` (class names).
fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> Result<(), RunError> {
    let json = serde_json::to_string_pretty(value).map_err(|e| RunError::Failure(e.to_string()))?;
    std::fs::write(path, json + "\n").map_err(|e| RunError::Failure(format!("cannot write {}: {e}", path.display())))
}

/// Starts the stop watchdog: until training begins a stop ends the process at once (loading
/// data and the rendezvous have nothing to save). Returns the prefix of this task's own lines:
/// the launcher puts the task before each line of a task it started.
fn watch_stops(inv: &Invocation, plan: &Plan) -> String {
    let launched = inv.env.iter().any(|(k, _)| k == "TRAINRUN_PROGRESS");
    let prefix = match plan.cluster.part {
        Part::Task(task) if !launched => format!("[{task}] "),
        Part::Task(_) | Part::Single | Part::Launcher => String::new(),
    };
    let say_prefix = prefix.clone();
    crate::signals::start_watchdog(move |text| eprintln!("{say_prefix}{text}"));
    prefix
}

/// Trains in this process: the whole run, or this task's part of a job. A sweep's trial
/// handed a control socket ([`crate::sweep::resident`]) pauses after its rung instead of
/// exiting, and trains on in this process when the sweep driver promotes it.
fn train_here(inv: &Invocation, p: &Prepared) -> Result<(), RunError> {
    // First thing: SIGTERM or Ctrl-C from here on is a request to stop, not death; until
    // training begins there is nothing to save, so the process ends at once.
    let stop = crate::signals::stop_requested();
    let prefix = watch_stops(inv, &p.plan);
    let control = match p.plan.cluster.part {
        Part::Single => crate::sweep::resident::TrialControl::from_env(&inv.env),
        Part::Launcher | Part::Task(_) => None,
    };
    let mut kept = None;
    let command: Vec<String> = std::env::args().collect();
    let result = segment(inv, p, &SegmentOptions { prefix: &prefix, stop, command: &command, first: true }, &mut kept);
    let Some(mut control) = control else { return result };
    result?;
    loop {
        crate::signals::training_paused();
        let DriverOrder::Continue { sets, env, command } = control.pause() else { return Ok(()) };
        let inv = Invocation { sets, env, launched: std::time::Instant::now(), ..inv.clone() };
        let next = prepare_to_train(&inv)?;
        // Only a later rung of the same trial trains on what this process holds.
        if !kept.as_ref().is_some_and(|k: &ResidentState| k.fits(p, &next)) {
            kept = None;
        }
        segment(&inv, &next, &SegmentOptions { prefix: &prefix, stop, command: &command, first: false }, &mut kept)?;
    }
}

/// What a resident trial keeps between its rungs: the data as loaded, and the session (the
/// models and strategy, with their buffers) where one process trains alone on the CPU.
struct ResidentState {
    dataset: Arc<Dataset>,
    normalization: Option<Normalization>,
    session: Option<train::Session>,
    /// The backup of the segment's last step, as this process wrote it.
    last_backup: Option<crate::checkpoint::HeldBackup>,
    /// The spec folder's git state, as `run.json` recorded it.
    git: Option<crate::provenance::Git>,
    /// The compute threads, with what they cached.
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl ResidentState {
    /// Whether `next` trains what `first` did, only to another step (what a later rung
    /// changes): the same resolved spec but for `train.epochs` and `train.stop_at_step`, the
    /// same threads.
    fn fits(&self, first: &Prepared, next: &Prepared) -> bool {
        let without_epochs = |p: &Prepared| {
            let mut spec = serde_json::to_value(&p.loaded.spec).unwrap_or_default();
            if let Some(train) = spec.get_mut("train").and_then(serde_json::Value::as_object_mut) {
                train.remove("epochs");
                train.remove("stop_at_step");
            }
            spec
        };
        first.plan.threads == next.plan.threads
            && first.plan.out_dir == next.plan.out_dir
            && without_epochs(first) == without_epochs(next)
    }
}

/// How one segment of a run in this process goes.
struct SegmentOptions<'a> {
    prefix: &'a str,
    stop: &'static std::sync::atomic::AtomicBool,
    /// The command line `run.json` records.
    command: &'a [String],
    /// The process's first segment (a resident trial's later rungs are not).
    first: bool,
}

/// Trains `p` in this process, reusing what `kept` holds and leaving there what a later rung
/// may reuse.
fn segment(
    inv: &Invocation,
    p: &Prepared,
    how: &SegmentOptions,
    kept: &mut Option<ResidentState>,
) -> Result<(), RunError> {
    let SegmentOptions { prefix, stop, command, first } = *how;
    let plan = &p.plan;
    let progress = progress_mode(inv);
    let (dataset, normalization, held, last_backup, git, threads) = match kept.take() {
        Some(k) => (k.dataset, k.normalization, k.session, k.last_backup, k.git, k.pool),
        None => {
            let (dataset, normalization) = load_preprocessed(inv, plan)?;
            (Arc::new(dataset), normalization, None, None, None, None)
        }
    };
    let (vocabulary, classes) = (dataset.vocabulary.clone(), dataset.classes.clone());
    let job = match plan.cluster.part {
        Part::Task(task) => Some(join(inv, plan, task, plan.model.params)?),
        Part::Single | Part::Launcher => None,
    };
    // Before the backup is read and anything is written into the run folder (after the
    // rendezvous, so a task refused from a job never takes a folder it would not train into):
    // one run at a time in it, and never a folder that is not a run's.
    let _lock = lock_run_folder(inv, p)?;
    let quiet = progress == ProgressMode::Quiet;
    let (note, warn) = (|t: &str| say(quiet, prefix, t), |w: &str| eprintln!("{prefix}{w}"));
    let rebuilt = match held {
        Some(session) => builder::rebuild(plan, session, last_backup, note, warn).map_err(RunError::from)?.ok(),
        None => None,
    };
    let built = match rebuilt {
        Some(built) => built,
        None => {
            builder::build(plan, Resources { dataset: dataset.clone(), job }, note, warn).map_err(RunError::from)?
        }
    };
    let builder::Built { mut session, mut callbacks, resume, chief } = built;
    // From here a stop waits for the step boundary and saves a backup first.
    crate::signals::training_started(plan.callbacks.backs_up());
    if chief && first {
        // A panic ends the process from the panicking thread: `run.json` says so, not
        // `running`. Set before the record is first written (it was set after, and a panic in
        // between, as `tests/panic_report.rs` makes one, left `running`).
        let (crashed, bug) = (p.plan.out_dir.clone(), crate::exit::Exit::Bug as u8);
        crate::crash::on_panic(move |report| crate::train::run_json::mark_panicked(&crashed, bug, report));
    }
    let resumed = resume.as_ref().map(|r| r.step);
    let mut record =
        if chief { Some(RunFolder::start(inv, p, resumed, normalization.clone(), command, git)?) } else { None };
    if let Some(r) = record.as_mut() {
        let dir = r.dir().path().to_path_buf();
        crate::signals::on_forced_stop(move |stop, why| crate::train::run_json::mark_stopped(&dir, stop, why));
    }
    if chief {
        if let Some(vocabulary) = vocabulary {
            write_json(&plan.out_dir.join("vocab.json"), &vocabulary)?;
        }
        if let Some(classes) = classes {
            write_json(&plan.out_dir.join("classes.json"), &classes)?;
        }
    }
    let opts = FitOptions { progress, prefix: prefix.to_string(), launched: inv.launched, stop };
    let threads = match threads {
        Some(threads) => Ok(threads),
        None => pool(plan.threads).map(Arc::new),
    };
    let fit = |pool: &rayon::ThreadPool| -> Result<(), RunError> {
        let run_dir = record.as_mut().map(RunFolder::dir);
        let summary = pool.install(|| train::fit(plan, &mut session, &mut callbacks, run_dir, &opts, resume))?;
        if let Some(r) = record.as_mut() {
            r.dir().summary(&summary).map_err(|e| RunError::Train(e.into()))?;
            if progress != ProgressMode::Quiet && progress != ProgressMode::Events {
                println!("wrote {}", r.dir().path().display());
            }
        }
        Ok(())
    };
    let (result, threads) = match threads {
        Ok(pool) => (fit(&pool), Some(pool)),
        Err(e) => (Err(e), None),
    };
    let result = result.map_err(interrupted);
    // One process training alone on the CPU keeps its session for a later rung; GPU buffers
    // and a job's peers are not kept.
    let on_cpu = plan.strategy.devices.iter().all(|d| d.kind == crate::vocab::DeviceKind::Cpu);
    let keeps = matches!(plan.cluster.part, Part::Single) && on_cpu;
    let last_backup = if keeps && result.is_ok() { callbacks.take_last_backup() } else { None };
    let git = record.as_ref().map(RunFolder::git);
    *kept = Some(ResidentState {
        dataset,
        normalization,
        session: keeps.then_some(session),
        last_backup,
        git,
        pool: threads,
    });
    if let Some(r) = record {
        let recorded = r.finish(inv, result.as_ref().map(|_| ()));
        // On a full disk `run.json` may not fit either: the failure to report is training's.
        return result.and(recorded);
    }
    result
}
