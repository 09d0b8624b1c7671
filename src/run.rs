//! One run end to end, the edge where I/O happens: load the spec, gather facts, plan, load the
//! data, build the model and strategy, train, and write the run folder.

use crate::checkpoint::{Layout, Store};
use crate::cli::Exit;
use crate::cluster::job::{self, Job, JobConfig};
use crate::cluster::tls::{TlsFiles, TlsMaterial};
use crate::cluster::{Address, Command, Resolution, Role as TaskRole, TaskId, launch, resolve_token};
use crate::collective::Communicator;
use crate::data::{DataDirs, DataError, Fetcher, Shard, Source};
use crate::engine::Shape;
use crate::plan::{Facts, Hardware, Plan, ShardPolicy, StrategyKind};
use crate::provenance::{Git, Host, rfc3339};
use crate::spec::{self, CollectiveTransport, CommunicationOptions, Diagnostic, Loaded};
use crate::strategy::{self, StrategyError, Variables};
use crate::train::progress::Mode;
use crate::train::record::{RunDir, RunDirOptions, Summary};
use crate::train::run_record::{RunRecord, RunStatus, Seeds, SpecSource, Topology};
use crate::train::saver::{self, Saver};
use crate::train::{self, FitOptions, Persistence, Session, TrainError, evaluator, resume};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The spec file.
    pub spec: PathBuf,
    /// `--set` overrides, in order.
    pub sets: Vec<String>,
    /// The process environment.
    pub env: Vec<(String, String)>,
    /// `--quiet`.
    pub quiet: bool,
    /// `--task`: which task of the cluster this process is.
    pub task: Option<String>,
    /// When the process started.
    pub launched: Instant,
}

/// Why a command failed; each maps to a documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The command line is malformed.
    #[error("error: {0}")]
    Usage(String),
    /// The spec has problems (already rendered with their locations).
    #[error("{0}")]
    Spec(String),
    /// The dataset could not be found, fetched or read.
    #[error("error: {0}")]
    Data(#[from] DataError),
    /// The spec is valid but cannot run here.
    #[error("error: {0}")]
    Unsupported(String),
    /// The job failed across processes (a task died, hung or was refused).
    #[error("error: {0}")]
    Cluster(String),
    /// Training failed.
    #[error("error: {0}")]
    Train(TrainError),
    /// A task of the local cluster failed.
    #[error("error: {0}")]
    Launch(launch::LaunchError),
    /// Anything else at runtime.
    #[error("error: {0}")]
    Failure(String),
    /// Trials of a sweep failed; the sweep exits with the first one's code.
    #[error("error: {message}")]
    TrialFailed {
        /// The first failed trial's exit code.
        code: u8,
        /// Which trials failed.
        message: String,
    },
    /// Stopped on request (SIGTERM) after saving a backup: not an error, a pause.
    #[error("trainrun: {0}")]
    Preempted(String),
}

impl RunError {
    /// The process exit code for this error.
    pub fn exit(&self) -> u8 {
        let code = match self {
            // The launcher passes on the code of the task that failed.
            RunError::Launch(launch::LaunchError::TaskFailed { code, .. }) | RunError::TrialFailed { code, .. } => {
                return *code;
            }
            RunError::Launch(launch::LaunchError::Preempted) | RunError::Preempted(_) => Exit::Preempted,
            RunError::Launch(_) => Exit::Cluster,
            RunError::Usage(_) | RunError::Spec(_) | RunError::Train(TrainError::Resume(_)) => Exit::Spec,
            RunError::Data(_) | RunError::Train(TrainError::Data(_)) => Exit::Data,
            RunError::Unsupported(_)
            | RunError::Train(TrainError::Strategy(StrategyError::NotBuilt(_) | StrategyError::Unsupported(_))) => {
                Exit::Unsupported
            }
            RunError::Cluster(_)
            | RunError::Train(TrainError::Strategy(
                StrategyError::Cluster(_) | StrategyError::Collective(_) | StrategyError::Finished,
            )) => Exit::Cluster,
            RunError::Train(_) | RunError::Failure(_) => Exit::Failure,
        };
        code as u8
    }
}

impl From<TrainError> for RunError {
    fn from(e: TrainError) -> Self {
        match e {
            TrainError::Preempted { .. } => RunError::Preempted(e.to_string()),
            e => RunError::Train(e),
        }
    }
}

impl From<crate::checkpoint::CheckpointError> for RunError {
    fn from(e: crate::checkpoint::CheckpointError) -> Self {
        RunError::Train(e.into())
    }
}

impl From<StrategyError> for RunError {
    fn from(e: StrategyError) -> Self {
        match e {
            StrategyError::NotBuilt(_) | StrategyError::Unsupported(_) => RunError::Unsupported(e.to_string()),
            StrategyError::Device(_) => RunError::Failure(e.to_string()),
            StrategyError::Cluster(_) | StrategyError::Collective(_) | StrategyError::Finished => {
                RunError::Cluster(e.to_string())
            }
        }
    }
}

/// A spec that loaded and planned, with what planning needed.
pub struct Prepared {
    /// The loaded spec and where its values came from.
    pub loaded: Loaded,
    /// The plan.
    pub plan: Plan,
    /// Where the data comes from.
    pub source: Source,
    /// The cluster and this process's task.
    pub cluster: Resolution,
    /// The sweep trial this run is (`TRAINRUN_SWEEP_TRIAL`), if it is one.
    pub trial: Option<crate::sweep::TrialRun>,
}

/// Why a loaded spec did not plan.
#[derive(Debug)]
pub enum Unplanned {
    /// Problems of the spec, to render against its origins.
    Spec(Vec<Diagnostic>),
    /// Anything else (data that cannot be read).
    Run(RunError),
}

fn data_dirs(env: &[(String, String)]) -> DataDirs {
    let var = |k: &str| env.iter().find(|(key, v)| key == k && !v.is_empty()).map(|(_, v)| PathBuf::from(v));
    DataDirs { trainrun_data_dir: var("TRAINRUN_DATA_DIR"), xdg_cache_home: var("XDG_CACHE_HOME"), home: var("HOME") }
}

/// Whether an environment flag is set to something other than empty, `0` or `false`.
fn flag(env: &[(String, String)], key: &str) -> bool {
    env.iter().any(|(k, v)| k == key && !matches!(v.as_str(), "" | "0" | "false"))
}

/// Loads and plans the spec, rendering every problem with its location. Under a sweep
/// (`TRAINRUN_SWEEP_TRIAL`), the spec is that trial's.
pub fn prepare(inv: &Invocation) -> Result<Prepared, RunError> {
    let base = spec::load(&inv.spec, &inv.env, &inv.sets).map_err(|e| RunError::Spec(e.to_string()))?;
    let (loaded, trial) = match crate::sweep::trial_from_env(&inv.env)? {
        Some(wanted) => {
            let (loaded, trial) = crate::sweep::load_trial(inv, &base, &wanted)?;
            (loaded, Some(trial))
        }
        None => (base, None),
    };
    let (plan, source, cluster) = match plan(&loaded, inv) {
        Ok(planned) => planned,
        Err(Unplanned::Spec(diags)) => return Err(RunError::Spec(spec::render(&diags, &loaded.origins))),
        Err(Unplanned::Run(e)) => return Err(e),
    };
    if !plan.warnings.is_empty() && !inv.quiet {
        eprint!("{}", spec::render(&plan.warnings, &loaded.origins));
    }
    Ok(Prepared { loaded, plan, source, cluster, trial })
}

/// Plans a loaded spec: gathers the facts (data sizes, cores, cluster) and calls the pure
/// planner.
pub fn plan(loaded: &Loaded, inv: &Invocation) -> Result<(Plan, Source, Resolution), Unplanned> {
    let source = Source::from_spec(&loaded.spec.data, &data_dirs(&inv.env), loaded.spec.run.seed)
        .map_err(|e| Unplanned::Run(e.into()))?;
    let multi_process = matches!(
        loaded.spec.strategy,
        spec::StrategySpec::MultiWorkerMirrored { .. } | spec::StrategySpec::ParameterServer { .. }
    );
    let port = loaded.spec.deploy.as_ref().map_or(spec::DeploySpec::default().port, |d| d.port);
    let cluster =
        crate::cluster::resolve::resolve(&loaded.spec.cluster, port, multi_process, &inv.env, inv.task.as_deref())
            .map_err(|d| Unplanned::Spec(vec![d]))?;
    let facts = Facts {
        data: source.facts().map_err(|e| named_files_missing(loaded, e))?,
        cores: std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        hardware: Hardware { gpus: 0 },
        cluster,
    };
    let plan = Plan::new(&loaded.spec, &facts).map_err(Unplanned::Spec)?;
    Ok((plan, source, facts.cluster))
}

/// Files the spec itself names (`[data.files]`) that do not exist are a spec error at their
/// key; other data problems stay data errors.
fn named_files_missing(loaded: &Loaded, e: DataError) -> Unplanned {
    let (DataError::MissingFiles { dir, files, .. }, Some(named)) = (&e, &loaded.spec.data.files) else {
        return Unplanned::Run(e.into());
    };
    let keys = [
        ("train_images", Some(&named.train_images)),
        ("train_labels", Some(&named.train_labels)),
        ("test_images", named.test_images.as_ref()),
        ("test_labels", named.test_labels.as_ref()),
    ];
    let diags: Vec<Diagnostic> = keys
        .iter()
        .filter_map(|(key, name)| name.filter(|n| files.contains(n)).map(|n| (key, n)))
        .map(|(key, name)| {
            Diagnostic::error(
                format!("data.files.{key}"),
                format!("data.files.{key} = \"{name}\" is not in {}", dir.display()),
            )
            .help("fix the file name, or point data.dir (or TRAINRUN_DATA_DIR) at the folder that holds it")
        })
        .collect();
    if diags.is_empty() { Unplanned::Run(e.into()) } else { Unplanned::Spec(diags) }
}

/// `trainrun check`: prints the plan.
pub fn check(inv: &Invocation, json: bool) -> Result<(), RunError> {
    let p = prepare(inv)?;
    let model = crate::model::build(&p.plan.model, &input_shape(&p.plan), p.plan.data.facts.classes as usize)
        .map_err(|d| RunError::Spec(spec::render(&d, &p.loaded.origins)))?;
    if json {
        let mut value = serde_json::to_value(&p.plan).map_err(|e| RunError::Failure(e.to_string()))?;
        value["model_params"] = model.param_len().into();
        println!("{}", serde_json::to_string_pretty(&value).map_err(|e| RunError::Failure(e.to_string()))?);
    } else {
        print!("{}", p.plan.render());
        println!(
            "  {:<20}  {}",
            "data folder",
            p.source.dir().map_or("(generated)".to_string(), |d| d.display().to_string())
        );
        print!("{}", crate::model::summary(&model));
        if let Some(sweep) = &p.loaded.spec.sweep {
            println!("{}", crate::sweep::check_note(&p.loaded, sweep)?);
        }
    }
    Ok(())
}

fn input_shape(plan: &Plan) -> Shape {
    let s = plan.data.facts.example_shape;
    Shape(vec![s.height, s.width, s.channels])
}

/// How this process takes part in the run.
enum Role {
    /// Everything in this process.
    Single,
    /// Starts and supervises every task of a local cluster.
    Launcher,
    /// One task of a multi-process job.
    Task(TaskId),
}

fn role(p: &Prepared) -> Role {
    let multi = matches!(p.plan.strategy.kind, StrategyKind::MultiWorkerMirrored | StrategyKind::ParameterServer);
    match (multi && p.cluster.cluster.tasks.len() > 1, p.cluster.task) {
        // TF_CONFIG's evaluator, split off the training cluster, runs on its own.
        (_, Some(task)) if multi && task.role == TaskRole::Evaluator => Role::Task(task),
        (false, _) => Role::Single,
        (true, None) => Role::Launcher,
        (true, Some(task)) => Role::Task(task),
    }
}

/// `trainrun SPEC`: trains (or launches the tasks that train) and writes the run folder.
pub fn train(inv: &Invocation) -> Result<(), RunError> {
    let p = prepare(inv)?;
    if p.loaded.spec.sweep.is_some() {
        return Err(crate::sweep::not_a_run(&inv.spec, &p.loaded));
    }
    // Refused before any process starts, not from inside every task.
    if p.plan.strategy.kind == StrategyKind::ParameterServer {
        return Err(RunError::from(StrategyError::NotBuilt(StrategyKind::ParameterServer.name())));
    }
    if p.plan.strategy.kind == StrategyKind::MultiWorkerMirrored {
        strategy::check_multi_worker_devices(&p.plan.strategy.devices)?;
    }
    match role(&p) {
        Role::Launcher => launch(inv, &p),
        Role::Single => train_here(inv, &p, None).map(|_| ()),
        Role::Task(task) if task.role == TaskRole::Evaluator => sidecar_evaluator(inv, &p, task),
        Role::Task(task) => train_here(inv, &p, Some(task)).map(|_| ()),
    }
}

/// SHA-256 of the resolved spec without what may change between a backup and its resume
/// without changing the training: the cluster, the strategy, the batch split (the global batch
/// is checked on its own) and output settings.
pub fn training_hash(spec: &spec::Spec) -> String {
    let mut s = spec.clone();
    s.cluster = Default::default();
    s.strategy = Default::default();
    s.batch = Default::default();
    s.run.name = None;
    s.run.out_dir = None;
    s.run.threads = None;
    s.extends = None;
    let json = serde_json::to_vec(&s).unwrap_or_default();
    Sha256::digest(&json).iter().map(|b| format!("{b:02x}")).collect()
}

/// The model's tensors, as checkpoints name them.
fn layout(model: &crate::engine::Sequential, params: usize, state: usize) -> Layout {
    Layout { tensors: model.tensors().to_vec(), state_tensors: model.state_tensors().to_vec(), params, state }
}

/// Prints a line unless quiet.
fn say(quiet: bool, prefix: &str, text: &str) {
    if !quiet {
        eprintln!("{prefix}{text}");
    }
}

/// `trainrun eval SPEC --checkpoint PATH`: evaluates one checkpoint on the test split.
pub fn eval(inv: &Invocation, checkpoint: &std::path::Path) -> Result<(), RunError> {
    let p = prepare(inv)?;
    let plan = &p.plan;
    let model = crate::model::build(&plan.model, &input_shape(plan), plan.data.facts.classes as usize)
        .map_err(|d| RunError::Spec(spec::render(&d, &p.loaded.origins)))?;
    let (params, state) = model.init(plan.seed);
    let layout = layout(&model, params.len(), state.len());
    let loaded = crate::checkpoint::store::load(checkpoint, &layout)?;
    if !flag(&inv.env, "TRAINRUN_OFFLINE") {
        p.source.fetch_missing(&Fetcher::default())?;
    }
    let dataset = p.source.load()?;
    let test = dataset.test.as_ref().ok_or_else(|| RunError::Failure("the dataset has no test split".into()))?;
    let batch = train::eval_batch_size(NonZeroUsize::MIN, 1, model.activation_len());
    let step = loaded.manifest.step;
    let mut replica =
        strategy::Replica::new(model, plan.train.loss_fn(), plan.data.facts.classes as usize, plan.threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(plan.threads)
        .build()
        .map_err(|e| RunError::Failure(format!("cannot start {} threads: {e}", plan.threads)))?;
    let stats = pool.install(|| evaluator::evaluate_checkpoint(&mut replica, test, batch, loaded));
    println!("checkpoint {} (step {step})", checkpoint.display());
    println!("test: loss: {:.4} - accuracy: {:.4}", stats.loss(), stats.accuracy());
    println!(
        "{}",
        serde_json::json!({ "step": step, "test_loss": stats.loss(), "test_accuracy": stats.accuracy(), "examples": stats.examples })
    );
    Ok(())
}

/// The evaluator task: joins the job's control plane (not the collective) and evaluates every
/// new checkpoint until training finishes.
fn sidecar_evaluator(inv: &Invocation, p: &Prepared, task: TaskId) -> Result<(), RunError> {
    // SIGTERM (a preemption of the job) ends the evaluator after the checkpoint at hand.
    let stop = crate::signals::stop_requested();
    let plan = &p.plan;
    // Planning refused an evaluator without a model_checkpoint callback.
    let dir =
        saver::model_dir(plan).ok_or_else(|| RunError::Failure("the evaluator has no checkpoints to watch".into()))?;
    let model = crate::model::build(&plan.model, &input_shape(plan), plan.data.facts.classes as usize)
        .map_err(|d| RunError::Spec(spec::render(&d, &p.loaded.origins)))?;
    let (params, state) = model.init(plan.seed);
    let layout = layout(&model, params.len(), state.len());
    if !flag(&inv.env, "TRAINRUN_OFFLINE") {
        p.source.fetch_missing(&Fetcher::default())?;
    }
    let dataset = p.source.load()?;
    let test = dataset.test.as_ref().ok_or_else(|| RunError::Failure("the dataset has no test split".into()))?;
    let batch = train::eval_batch_size(NonZeroUsize::MIN, 1, model.activation_len());
    // Outside the training cluster (TF_CONFIG listed it there), it learns the end from the
    // chief's run record instead of the control plane.
    let job = match p.cluster.cluster.tasks.contains_key(&task) {
        true => Some(join_job(inv, p, task, 0)?),
        false => None,
    };
    let record = crate::train::ended::Watcher::new(&plan.out_dir);
    // Its lines are the evaluator's output, shown unless `--quiet`: the launcher prefixes
    // them with the task itself.
    let quiet = inv.quiet;
    let prefix =
        if inv.env.iter().any(|(k, _)| k == "TRAINRUN_PROGRESS") { String::new() } else { format!("[{task}] ") };
    let mut replica =
        strategy::Replica::new(model, plan.train.loss_fn(), plan.data.facts.classes as usize, plan.threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(plan.threads)
        .build()
        .map_err(|e| RunError::Failure(format!("cannot start {} threads: {e}", plan.threads)))?;
    let watch = evaluator::Watch { dir, out: plan.out_dir.join("eval.jsonl"), layout: &layout, test, batch };
    let plane = job.as_ref().map(|j| &j.plane);
    let finished = || -> Result<bool, TrainError> {
        let mut done = stop.load(std::sync::atomic::Ordering::SeqCst);
        let Some(plane) = plane else {
            return Ok(done || record.ended());
        };
        while let Some(c) = plane.poll_command().map_err(|e| TrainError::Strategy(e.into()))? {
            done |= matches!(c, Command::Stop { .. });
        }
        Ok(done)
    };
    let count = pool.install(|| evaluator::watch(&watch, &mut replica, finished, |t| say(quiet, &prefix, t)))?;
    say(quiet, &prefix, &format!("evaluated {count} checkpoint{}", if count == 1 { "" } else { "s" }));
    if let Some(job) = job {
        job.plane.shutdown();
    }
    if stop.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(RunError::Preempted("preempted: the evaluator stopped on SIGTERM".into()));
    }
    Ok(())
}

fn progress_mode(inv: &Invocation) -> Mode {
    match inv.env.iter().find(|(k, _)| k == "TRAINRUN_PROGRESS").map(|(_, v)| v.as_str()) {
        Some("events") => Mode::Events,
        Some("quiet") => Mode::Quiet,
        _ => Mode::detect(inv.quiet),
    }
}

/// The communication options of a multi-worker plan.
fn communication(p: &Prepared) -> (f64, u64, CollectiveTransport) {
    match &p.loaded.spec.strategy {
        spec::StrategySpec::MultiWorkerMirrored { communication: c, .. } => {
            (c.timeout_s, c.bytes_per_pack, c.transport)
        }
        _ => (
            CommunicationOptions::default().timeout_s,
            CommunicationOptions::default().bytes_per_pack,
            CollectiveTransport::Auto,
        ),
    }
}

/// Starts every task of the local cluster as a process of this binary and supervises them.
fn launch(inv: &Invocation, p: &Prepared) -> Result<(), RunError> {
    let exe =
        std::env::current_exe().map_err(|e| RunError::Failure(format!("cannot find the trainrun binary: {e}")))?;
    let mut args = vec![inv.spec.display().to_string()];
    for s in &inv.sets {
        args.extend(["--set".to_string(), s.clone()]);
    }
    let (timeout_s, _, _) = communication(p);
    let c = &p.loaded.spec.cluster;
    let run = launch::Launch {
        exe,
        args,
        cluster: p.cluster.cluster.clone(),
        grace: Duration::from_secs_f64(timeout_s + 2.0),
        progress: Mode::detect(inv.quiet),
        epochs: p.plan.train.epochs,
        max_restarts: c.max_restarts,
        restart_backoff: Duration::from_secs_f64(c.restart_backoff_s),
        stop: crate::signals::stop_requested(),
    };
    if let Err(e) = launch::run(run) {
        let error = match e {
            launch::LaunchError::Preempted => RunError::Preempted(e.to_string()),
            e => RunError::Launch(e),
        };
        // A chief killed before it could say so leaves `run.json` at `running`.
        if !matches!(error, RunError::Preempted(_)) {
            crate::train::run_record::mark_failed(&p.plan.out_dir, error.exit(), &error.to_string());
        }
        return Err(error);
    }
    if !inv.quiet {
        println!("wrote {}", p.plan.out_dir.display());
    }
    Ok(())
}

/// Joins the job as `task`: control plane, rendezvous, data plane.
fn join_job(inv: &Invocation, p: &Prepared, task: TaskId, params: usize) -> Result<Job, RunError> {
    let mut addresses = BTreeMap::new();
    for (t, a) in &p.cluster.cluster.tasks {
        match a {
            Address::At(a) => addresses.insert(*t, a.clone()),
            Address::Local => {
                return Err(RunError::Spec(spec::render(
                    &[Diagnostic::error(
                        "cluster",
                        format!("{t} has no address: a count of local tasks is started by `trainrun SPEC` itself"),
                    )
                    .help("run without --task / TRAINRUN_TASK, or list host:port addresses in [cluster]")],
                    &p.loaded.origins,
                )));
            }
        };
    }
    let env_token = inv.env.iter().find(|(k, _)| k == "TRAINRUN_JOB_TOKEN").map(|(_, v)| v.as_str());
    let token = resolve_token(env_token, p.loaded.spec.cluster.token_file.as_deref())
        .map_err(|e| RunError::Cluster(e.to_string()))?;
    let (timeout_s, _, transport) = communication(p);
    let tls = match &p.loaded.spec.cluster.tls {
        None => None,
        Some(t) => {
            let files = TlsFiles { cert: t.cert_file.clone(), key: t.key_file.clone(), ca: t.ca_file.clone() };
            Some(Arc::new(TlsMaterial::load(files).map_err(|e| RunError::Cluster(e.to_string()))?))
        }
    };
    job::join(JobConfig {
        task,
        addresses,
        token,
        // Only what changes the results must agree: `summary.json`'s `spec_sha256`.
        spec_hash: p.loaded.spec.results_sha256(),
        spec_keys: p.loaded.spec.results_keys(),
        tls,
        startup: Duration::from_secs_f64(p.loaded.spec.cluster.startup_timeout_s),
        timeout: Duration::from_secs_f64(timeout_s),
        transport,
        arena_floats: params,
    })
    .map_err(|e| RunError::Cluster(e.to_string()))
}

/// Trains in this process: the whole run, or `task`'s part of a job.
fn train_here(inv: &Invocation, p: &Prepared, task: Option<TaskId>) -> Result<Summary, RunError> {
    // First thing: a SIGTERM from here on is a request to stop cleanly, not death.
    let stop = crate::signals::stop_requested();
    let plan = &p.plan;
    // One model per local replica; planning checked the spec, so every build succeeds alike.
    let models = (0..plan.strategy.devices.len())
        .map(|_| crate::model::build(&plan.model, &input_shape(plan), plan.data.facts.classes as usize))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|d| RunError::Spec(spec::render(&d, &p.loaded.origins)))?;
    let first = &models[0];
    let (params, state) = first.init(plan.seed);
    let (tensors, state_tensors) = (first.tensors().to_vec(), first.state_tensors().to_vec());
    let activation_len = first.activation_len();

    // TRAINRUN_OFFLINE (as HF_HUB_OFFLINE): never download; missing files are an error
    // naming them and the folder to put them in.
    if !flag(&inv.env, "TRAINRUN_OFFLINE") {
        p.source.fetch_missing(&Fetcher::default())?;
    }
    let dataset = Arc::new(p.source.load()?);

    let (strategy, shard, chief, prefix): (Box<dyn strategy::Strategy>, Shard, bool, String) = match task {
        None => (strategy::build(plan, models)?, Shard::WHOLE, true, String::new()),
        Some(task) => {
            let job = join_job(inv, p, task, params.len())?;
            let (rank, workers) = job.comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world()));
            let count = NonZeroUsize::new(workers).unwrap_or(NonZeroUsize::MIN);
            let shard = match plan.data.shard {
                ShardPolicy::Data => Shard::new(rank, count)?,
                // Every worker reads the same examples: the duplicates `off` asks for.
                ShardPolicy::Off => Shard::new(0, count)?,
                ShardPolicy::None | ShardPolicy::File => Shard::WHOLE,
            };
            let is_chief = job.is_chief;
            // The worker's threads are shared out among its local replicas.
            let threads = (plan.threads / models.len().max(1)).max(1);
            let classes = plan.data.facts.classes as usize;
            let replicas =
                models.into_iter().map(|m| strategy::Replica::new(m, plan.train.loss_fn(), classes, threads)).collect();
            let (_, bytes_per_pack, _) = communication(p);
            let s = strategy::MultiWorkerMirrored::new(replicas, job, bytes_per_pack)?;
            (Box::new(s) as Box<dyn strategy::Strategy>, shard, is_chief, format!("[{task}] "))
        }
    };

    let optimizer = plan.optimizer.build(params.len());
    let layout = Layout {
        tensors: tensors.clone(),
        state_tensors: state_tensors.clone(),
        params: params.len(),
        state: state.len(),
    };
    let mut session = Session {
        vars: Variables { params, state },
        optimizer,
        strategy,
        dataset,
        shard,
        tensors,
        state_tensors,
        activation_len,
    };
    let progress = progress_mode(inv);
    let prefix = if progress == Mode::Events { String::new() } else { prefix };
    let quiet = progress == Mode::Quiet;
    let hash = training_hash(&p.loaded.spec);
    let loaded = match (chief, saver::backup_dir(plan)) {
        (true, Some(dir)) => Store::new(dir).latest_good(&layout, |w| eprintln!("{prefix}warning: {w}"))?,
        _ => None,
    };
    let resumed = resume::restore(plan, &mut session, chief, loaded, &hash, |t| say(quiet, &prefix, t))?;
    let resolved = toml::to_string_pretty(&p.loaded.spec).map_err(|e| RunError::Failure(e.to_string()))?;
    let options = RunDirOptions {
        resolved_spec: resolved,
        spec_sha256: p.loaded.spec.results_sha256(),
        log_every_steps: p.loaded.spec.run.log_every_steps.get(),
        launched: inv.launched,
    };
    let mut run_dir = match (chief, &resumed) {
        (false, _) => None,
        (true, None) => Some(RunDir::create(&plan.out_dir, options).map_err(|e| RunError::Train(e.into()))?),
        (true, Some(r)) => Some(RunDir::resume(&plan.out_dir, options, r.step).map_err(|e| RunError::Train(e.into()))?),
    };
    let mut record = run_dir.as_ref().map(|_| run_record(inv, p, task));
    if let (Some(d), Some(r)) = (&run_dir, &record) {
        d.record(r).map_err(|e| RunError::Train(e.into()))?;
    }
    let saver = if chief { Saver::new(plan, layout, hash, &session.optimizer)? } else { None };
    let persist = Persistence { resume: resumed, saver };
    let opts = FitOptions { progress, prefix, launched: inv.launched, stop };
    let result = fit_session(p, session, &opts, persist, run_dir.as_mut());
    if let (Some(d), Some(r)) = (&run_dir, &mut record) {
        // A preempted run is paused, not failed: the next launch resumes it.
        let failure = result.as_ref().err().filter(|e| !matches!(e, RunError::Preempted(_)));
        r.finish(inv.launched, failure.map(|e| (e.exit(), e.to_string())));
        d.record(r).map_err(|e| RunError::Train(e.into()))?;
    }
    result
}

/// `run.json` as training starts.
fn run_record(inv: &Invocation, p: &Prepared, task: Option<TaskId>) -> RunRecord {
    let folder = inv.spec.parent().unwrap_or(std::path::Path::new("."));
    let mut env_overrides: Vec<String> = inv
        .env
        .iter()
        .filter(|(k, _)| k.to_ascii_uppercase().starts_with("TRAINRUN_") && k.contains("__"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env_overrides.sort();
    let tasks = p
        .cluster
        .cluster
        .tasks
        .iter()
        .map(|(t, a)| {
            let address = match a {
                Address::Local => "local".to_string(),
                Address::At(a) => a.clone(),
            };
            (t.to_string(), address)
        })
        .collect();
    RunRecord {
        trainrun_version: env!("CARGO_PKG_VERSION"),
        status: RunStatus::Running,
        exit_code: None,
        error: None,
        started_at: {
            let now = std::time::SystemTime::now();
            rfc3339(now.checked_sub(inv.launched.elapsed()).unwrap_or(now))
        },
        ended_at: None,
        wall_s: None,
        command: std::env::args().collect(),
        cwd: std::env::current_dir().ok().map(|d| d.display().to_string()),
        spec: SpecSource {
            path: inv.spec.display().to_string(),
            files: p.loaded.files.iter().map(|f| f.display().to_string()).collect(),
            sets: inv.sets.clone(),
            env_overrides,
            sha256: p.loaded.spec.results_sha256(),
        },
        seeds: Seeds { run: p.plan.seed, sweep: p.trial.as_ref().map(|t| t.sweep_seed) },
        sweep: p.trial.as_ref().map(|t| t.origin.clone()),
        git: Git::of(folder),
        cluster: Topology {
            strategy: p.plan.strategy.kind,
            source: p.cluster.cluster.source,
            tasks,
            task: task.map(|t| t.to_string()),
            num_workers: p.plan.strategy.num_workers,
            num_replicas_in_sync: p.plan.strategy.num_replicas_in_sync,
            threads: p.plan.threads,
        },
        host: Host::here(),
    }
}

/// The parts of training after the run folder exists, so that their failure is recorded.
fn fit_session(
    p: &Prepared,
    mut session: Session,
    opts: &FitOptions,
    persist: Persistence,
    mut run_dir: Option<&mut RunDir>,
) -> Result<Summary, RunError> {
    let plan = &p.plan;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(plan.threads)
        .build()
        .map_err(|e| RunError::Failure(format!("cannot start {} threads: {e}", plan.threads)))?;
    let summary = pool.install(|| train::fit(plan, &mut session, run_dir.as_deref_mut(), opts, persist))?;
    if let Some(d) = run_dir {
        d.summary(&summary).map_err(|e| RunError::Train(e.into()))?;
        if opts.progress != Mode::Quiet && opts.progress != Mode::Events {
            println!("wrote {}", d.path().display());
        }
    }
    Ok(summary)
}
