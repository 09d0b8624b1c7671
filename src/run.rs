//! One run end to end, the edge where I/O happens: load the spec, gather facts, plan, load the
//! data, build the model and strategy, train, and write the run folder.

use crate::cli::Exit;
use crate::data::{DataDirs, DataError, Fetcher, Shard, Source};
use crate::engine::Shape;
use crate::plan::{Facts, Hardware, Plan};
use crate::spec::{self, Diagnostic, Loaded};
use crate::strategy::{self, StrategyError, Variables};
use crate::train::record::{RunDir, Summary};
use crate::train::{self, FitOptions, Session, TrainError};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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
    /// Training failed.
    #[error("error: {0}")]
    Train(TrainError),
    /// Anything else at runtime.
    #[error("error: {0}")]
    Failure(String),
}

impl RunError {
    /// The process exit code for this error.
    pub fn exit(&self) -> Exit {
        match self {
            RunError::Usage(_) | RunError::Spec(_) => Exit::Spec,
            RunError::Data(_) | RunError::Train(TrainError::Data(_)) => Exit::Data,
            RunError::Unsupported(_)
            | RunError::Train(TrainError::Strategy(StrategyError::NotBuilt(_) | StrategyError::Unsupported(_))) => {
                Exit::Unsupported
            }
            RunError::Train(_) | RunError::Failure(_) => Exit::Failure,
        }
    }
}

impl From<TrainError> for RunError {
    fn from(e: TrainError) -> Self {
        RunError::Train(e)
    }
}

impl From<StrategyError> for RunError {
    fn from(e: StrategyError) -> Self {
        match e {
            StrategyError::NotBuilt(_) | StrategyError::Unsupported(_) => RunError::Unsupported(e.to_string()),
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
}

fn data_dirs(env: &[(String, String)]) -> DataDirs {
    let var = |k: &str| env.iter().find(|(key, v)| key == k && !v.is_empty()).map(|(_, v)| PathBuf::from(v));
    DataDirs { trainrun_data_dir: var("TRAINRUN_DATA_DIR"), xdg_cache_home: var("XDG_CACHE_HOME"), home: var("HOME") }
}

/// Whether an environment flag is set to something other than empty, `0` or `false`.
fn flag(env: &[(String, String)], key: &str) -> bool {
    env.iter().any(|(k, v)| k == key && !matches!(v.as_str(), "" | "0" | "false"))
}

/// Loads and plans the spec, rendering every problem with its location.
pub fn prepare(inv: &Invocation) -> Result<Prepared, RunError> {
    let loaded = spec::load(&inv.spec, &inv.env, &inv.sets).map_err(|e| RunError::Spec(e.to_string()))?;
    let source = Source::from_spec(&loaded.spec.data, &data_dirs(&inv.env), loaded.spec.run.seed)?;
    let multi_process = matches!(
        loaded.spec.strategy,
        spec::StrategySpec::MultiWorkerMirrored { .. } | spec::StrategySpec::ParameterServer { .. }
    );
    let cluster = crate::cluster::resolve::resolve(&loaded.spec.cluster, multi_process, &inv.env, inv.task.as_deref())
        .map_err(|d| RunError::Spec(spec::render(&[d], &loaded.origins)))?;
    let facts = Facts {
        data: source.facts().map_err(|e| named_files_missing(&loaded, e))?,
        cores: std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        hardware: Hardware { gpus: 0 },
        cluster,
    };
    match Plan::new(&loaded.spec, &facts) {
        Ok(plan) => {
            if !plan.warnings.is_empty() && !inv.quiet {
                eprint!("{}", spec::render(&plan.warnings, &loaded.origins));
            }
            Ok(Prepared { loaded, plan, source })
        }
        Err(diags) => Err(RunError::Spec(spec::render(&diags, &loaded.origins))),
    }
}

/// Files the spec itself names (`[data.files]`) that do not exist are a spec error at their
/// key; other data problems stay data errors.
fn named_files_missing(loaded: &Loaded, e: DataError) -> RunError {
    let (DataError::MissingFiles { dir, files, .. }, Some(named)) = (&e, &loaded.spec.data.files) else {
        return e.into();
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
    if diags.is_empty() { e.into() } else { RunError::Spec(spec::render(&diags, &loaded.origins)) }
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
    }
    Ok(())
}

fn input_shape(plan: &Plan) -> Shape {
    let s = plan.data.facts.example_shape;
    Shape(vec![s.height, s.width, s.channels])
}

/// `trainrun SPEC`: trains and writes the run folder.
pub fn train(inv: &Invocation) -> Result<Summary, RunError> {
    let p = prepare(inv)?;
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
    let strategy = strategy::build(plan, models)?;

    // TRAINRUN_OFFLINE (as HF_HUB_OFFLINE): never download; missing files are an error
    // naming them and the folder to put them in.
    if !flag(&inv.env, "TRAINRUN_OFFLINE") {
        p.source.fetch_missing(&Fetcher::default())?;
    }
    let dataset = Arc::new(p.source.load()?);
    let shard = Shard::new(0, NonZeroUsize::MIN)?;
    let resolved = toml::to_string_pretty(&p.loaded.spec).map_err(|e| RunError::Failure(e.to_string()))?;
    let mut run_dir = RunDir::create(&plan.out_dir, &resolved).map_err(|e| RunError::Train(e.into()))?;
    let optimizer = plan.optimizer.build(params.len());
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
    let opts = FitOptions {
        progress: train::progress::Mode::detect(inv.quiet),
        prefix: String::new(),
        launched: inv.launched,
        writes: true,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(plan.threads)
        .build()
        .map_err(|e| RunError::Failure(format!("cannot start {} threads: {e}", plan.threads)))?;
    let summary = pool.install(|| train::fit(plan, &mut session, &mut run_dir, &opts))?;
    run_dir.summary(&summary).map_err(|e| RunError::Train(e.into()))?;
    if !inv.quiet {
        println!("wrote {}", run_dir.path().display());
    }
    Ok(summary)
}
