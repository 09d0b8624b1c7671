//! Preparing a run, before anything trains: load the spec (and, under a sweep, its trial's
//! values), gather the facts planning needs (the data source and its sizes, cores, the
//! cluster), and plan. Every command that takes a spec starts here.

use crate::data::DataDirs;
use crate::data::DataError;
use crate::exit::RunError;
use crate::plan::{Facts, Hardware, Plan, PlanError, StrategyKind, TooBig};
use crate::spec::sweep::Sweep;
use crate::spec::{self, Diagnostic, Loaded};
use crate::train::run_json::TrialOrigin;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Instant;

/// The environment variable that makes `trainrun SPEC` run one trial of SPEC's sweep.
pub const TRIAL_VAR: &str = "TRAINRUN_SWEEP_TRIAL";

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

/// A spec that loaded and planned, with what planning needed.
pub struct Prepared {
    /// The loaded spec and where its values came from.
    pub loaded: Loaded,
    /// The plan.
    pub plan: Plan,
    /// The sweep trial this run is (`TRAINRUN_SWEEP_TRIAL`), if it is one.
    pub trial: Option<TrialRun>,
}

/// Why a loaded spec did not plan.
#[derive(Debug)]
pub enum Unplanned {
    /// Problems of the spec, to render against its origins.
    Spec(Vec<Diagnostic>),
    /// Anything else (data that cannot be read).
    Run(RunError),
    /// A valid spec whose model this machine cannot hold.
    TooBig(Box<TooBig>),
}

pub fn data_dirs(env: &[(String, String)]) -> DataDirs {
    let var = |k: &str| env.iter().find(|(key, v)| key == k && !v.is_empty()).map(|(_, v)| PathBuf::from(v));
    DataDirs {
        trainrun_data_dir: var("TRAINRUN_DATA_DIR"),
        xdg_cache_home: var("XDG_CACHE_HOME"),
        home: var("HOME"),
        token_cache: var("TRAINRUN_TOKEN_CACHE"),
        data_cache: var("TRAINRUN_DATA_CACHE"),
    }
}

/// Whether an environment flag is set to something other than empty, `0` or `false`.
pub fn flag(env: &[(String, String)], key: &str) -> bool {
    env.iter().any(|(k, v)| k == key && !matches!(v.as_str(), "" | "0" | "false"))
}

/// Loads and plans the spec, rendering every problem with its location. Under a sweep
/// (`TRAINRUN_SWEEP_TRIAL`), the spec is that trial's.
pub fn prepare(inv: &Invocation) -> Result<Prepared, RunError> {
    match prepared(inv, false)? {
        Ok(prepared) => Ok(prepared),
        Err(too_big) => Err(RunError::Unsupported(too_big.to_string())),
    }
}

/// As [`prepare`], for `trainrun SPEC`, which trains: planned by [`plan_to_train`].
pub fn prepare_to_train(inv: &Invocation) -> Result<Prepared, RunError> {
    match prepared(inv, true)? {
        Ok(prepared) => Ok(prepared),
        Err(too_big) => Err(RunError::Unsupported(too_big.to_string())),
    }
}

/// As [`prepare_to_train`], but a model this machine cannot hold comes back as what it needs,
/// for `trainrun check` to warn about (a spec is often checked on a smaller machine than it
/// runs on).
pub fn prepare_or_too_big(inv: &Invocation) -> Result<Result<Prepared, Box<TooBig>>, RunError> {
    prepared(inv, true)
}

/// Loads and plans `inv`'s spec, by [`plan_to_train`] when it `trains`.
fn prepared(inv: &Invocation, trains: bool) -> Result<Result<Prepared, Box<TooBig>>, RunError> {
    let base = spec::load(&inv.spec, &inv.env, &inv.sets).map_err(|e| RunError::Spec(e.to_string()))?;
    let (loaded, trial) = match trial_from_env(&inv.env)? {
        Some(wanted) => {
            let (loaded, trial) = load_trial(inv, &base, &wanted)?;
            (loaded, Some(trial))
        }
        None => (base, None),
    };
    let planned = if trains { plan_to_train(&loaded, inv) } else { plan(&loaded, inv) };
    let plan = match planned {
        Ok(planned) => planned,
        Err(Unplanned::Spec(diags)) => return Err(RunError::Spec(spec::render(&diags, &loaded.origins))),
        Err(Unplanned::Run(e)) => return Err(e),
        Err(Unplanned::TooBig(too_big)) => return Ok(Err(too_big)),
    };
    if !plan.warnings.is_empty() && !inv.quiet {
        eprint!("{}", spec::render(&plan.warnings, &loaded.origins));
    }
    Ok(Ok(Prepared { loaded, plan, trial }))
}

/// Plans a loaded spec: gathers the facts (data sizes, cores, cluster) and calls the pure
/// planner.
pub fn plan(loaded: &Loaded, inv: &Invocation) -> Result<Plan, Unplanned> {
    // Before anything plans a layer or runs one: the row decides paths and sums' order.
    crate::engine::tuning::pin(loaded.spec.run.cpu_tuning);
    let source = crate::plan::source(&loaded.spec.data, &data_dirs(&inv.env), loaded.spec.run.seed)
        .map_err(|e| Unplanned::Run(e.into()))?;
    let multi_process = StrategyKind::of(&loaded.spec.strategy).multi_process();
    let port = loaded.spec.deploy.as_ref().map_or(spec::DeploySpec::default().port, |d| d.port);
    let cluster =
        crate::cluster::resolve::resolve(&loaded.spec.cluster, port, multi_process, &inv.env, inv.task.as_deref())
            .map_err(|d| Unplanned::Spec(vec![d]))?;
    let facts = Facts {
        data: source.facts().map_err(|e| named_files_missing(loaded, e))?,
        source,
        cores: std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        bf16: crate::engine::bf16::Bf16Support::detect(),
        hardware: Hardware { gpus: 0 },
        cluster,
        memory: crate::machine_memory::read(&inv.env).map_err(|e| Unplanned::Run(RunError::Usage(e.to_string())))?,
    };
    Plan::new(&loaded.spec, &facts).map_err(|e| match e {
        PlanError::Spec(diags) => Unplanned::Spec(diags),
        PlanError::TooBig(too_big) => Unplanned::TooBig(too_big),
    })
}

/// As [`plan`], for a run that will train (and so be tracked): an `MLFLOW_TRACKING_URI` that
/// names no server is refused with the spec's problems, so they come all at once. Commands
/// that only read a run (`eval`, `predict`) never track, so the variable is not theirs to judge.
pub fn plan_to_train(loaded: &Loaded, inv: &Invocation) -> Result<Plan, Unplanned> {
    let planned = plan(loaded, inv);
    match (crate::tracking::env_uri_problem(loaded.spec.run.tracking.as_ref(), &inv.env), planned) {
        (None, planned) => planned,
        (Some(problem), Err(Unplanned::Spec(mut diags))) => {
            diags.push(problem);
            Err(Unplanned::Spec(diags))
        }
        (Some(problem), _) => Err(Unplanned::Spec(vec![problem])),
    }
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

/// The trial a child process is asked to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedTrial {
    /// 1-based trial number.
    pub index: usize,
    /// The hash its resolved spec had when the sweep validated it.
    pub sha256: Option<String>,
}

/// `TRAINRUN_SWEEP_TRIAL` (`3` or `3:<hash>`), if set.
pub fn trial_from_env(env: &[(String, String)]) -> Result<Option<WantedTrial>, RunError> {
    let Some((_, value)) = env.iter().find(|(k, v)| k == TRIAL_VAR && !v.is_empty()) else {
        return Ok(None);
    };
    let (index, sha256) = match value.split_once(':') {
        Some((i, h)) => (i, Some(h.to_string())),
        None => (value.as_str(), None),
    };
    match index.trim().parse::<usize>() {
        Ok(index) if index > 0 => Ok(Some(WantedTrial { index, sha256 })),
        _ => Err(RunError::Usage(format!(
            "{TRIAL_VAR}={value} does not name a trial: `trainrun sweep` sets it to a trial number, e.g. 3"
        ))),
    }
}

/// What a trial run records about its sweep.
#[derive(Debug, Clone)]
pub struct TrialRun {
    /// Which trial, with its values.
    pub origin: TrialOrigin,
    /// The sweep seed.
    pub sweep_seed: u64,
}

/// Trial `index` as the sweep drew it by TPE, from the record it wrote to `sweep.json` in its
/// folder before running the trial.
fn drawn_trial(sweep: &Sweep, index: usize) -> Option<crate::spec::sweep::Trial> {
    use serde_json::Value as Json;
    let text = std::fs::read_to_string(sweep.dir.join("sweep.json")).ok()?;
    let record: Json = serde_json::from_str(&text).ok()?;
    let trials = record.get("trials")?.as_array()?;
    let recorded = trials.iter().find(|t| t.get("index").and_then(Json::as_u64) == Some(index as u64))?;
    let values: Vec<(String, Json)> = serde_json::from_value(recorded.get("values")?.clone()).ok()?;
    let name = recorded.get("name").and_then(Json::as_str);
    sweep.drawn(index, values).filter(|t| Some(t.name.as_str()) == name)
}

/// Loads trial `wanted` of the sweep in `base` (loaded from `inv`).
pub fn load_trial(inv: &Invocation, base: &Loaded, wanted: &WantedTrial) -> Result<(Loaded, TrialRun), RunError> {
    let sweep = match Sweep::new(base) {
        Ok(Some(sweep)) => sweep,
        Ok(None) => {
            return Err(RunError::Usage(format!(
                "{TRIAL_VAR} names a sweep trial, but {} has no [sweep] section; unset {TRIAL_VAR}",
                inv.spec.display()
            )));
        }
        Err(diags) => return Err(RunError::Spec(spec::render(&diags, &base.origins))),
    };
    // A trial drawn by TPE is not in the spec: the sweep recorded it before running it.
    let trial = sweep.trials.get(wanted.index - 1).cloned().or_else(|| drawn_trial(&sweep, wanted.index));
    let Some(trial) = trial else {
        return Err(RunError::Usage(format!(
            "{TRIAL_VAR}={} is past the last of the {} trials of {}",
            wanted.index,
            sweep.trials.len(),
            inv.spec.display()
        )));
    };
    let loaded = spec::load_trial(&inv.spec, &inv.env, &inv.sets, &sweep.assignments(&trial))
        .map_err(|e| RunError::Spec(e.to_string()))?;
    if let Some(expected) = &wanted.sha256
        && *expected != loaded.spec.results_sha256()
    {
        return Err(RunError::Usage(format!(
            "trial {} of {} is not the trial the sweep validated: the spec changed since the sweep \
             started; run `trainrun sweep {}` again",
            trial.index,
            inv.spec.display(),
            inv.spec.display()
        )));
    }
    let origin = TrialOrigin {
        trial: trial.index,
        name: trial.name.clone(),
        values: trial.values.iter().map(|a| (a.key.clone(), a.value.clone())).collect(),
    };
    Ok((loaded, TrialRun { origin, sweep_seed: sweep.seed }))
}
