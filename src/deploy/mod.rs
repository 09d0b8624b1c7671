//! `trainrun manifest SPEC --for kubernetes|tfjob|slurm`: ready-to-apply job files from a spec,
//! one file per target. Rendering is pure ([`render`]): the resolved spec and the options in,
//! text out; [`run`] is the edge that loads and checks the spec first.
//!
//! Every target runs the same resolved spec, written into the job (a ConfigMap, or a here-doc
//! in the sbatch script) with the run name fixed, so pods and Slurm tasks agree on it whatever
//! the file is called where it lands.
//!
//! A sweep spec becomes a job array instead ([`TrialArray`]): a Slurm `--array` or a Kubernetes
//! Indexed Job of one index per trial, each running `trainrun sweep SPEC --trial I` into the
//! shared sweep folder, at most `--parallel` at once.

pub mod certs;
mod kubernetes;
mod slurm;
mod tfjob;

use crate::cluster::{Role, TaskId};
use crate::exit::RunError;
use crate::prepare::{Invocation, Unplanned};
use crate::spec::{self, DeploySpec, Spec, TlsSpec};
use std::num::NonZeroUsize;
use std::path::PathBuf;

/// Where the job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// A ConfigMap, a headless Service and an Indexed Job (plus the token Secret and the
    /// run-folder claim): plain Kubernetes, no operator.
    Kubernetes,
    /// A Kubeflow TFJob (training operator), which sets TF_CONFIG itself.
    Tfjob,
    /// An sbatch script that runs `srun trainrun …`.
    Slurm,
}

/// The command line's part.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--image`: overrides `deploy.image`.
    pub image: Option<String>,
    /// `--namespace`: the Kubernetes namespace of every object.
    pub namespace: Option<String>,
    /// The job token for a Secret the manifest creates; the edge draws a fresh one.
    pub token: String,
    /// `--parallel`: trials of a sweep run at once (default: all).
    pub parallel: Option<NonZeroUsize>,
}

/// A sweep as a job array: one index per trial, `parallel` at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrialArray {
    /// Trials, so indexes `0..trials`.
    pub trials: usize,
    /// Indexes run at once (at most `trials`).
    pub parallel: usize,
}

/// The job array of `spec`'s sweep, `None` for a spec without one.
fn trial_array(spec: &Spec, options: &Options) -> Result<Option<TrialArray>, ManifestError> {
    let Some(section) = &spec.sweep else {
        return match options.parallel {
            Some(p) => Err(ManifestError::Spec(format!(
                "--parallel {p} sets how many trials of a sweep run at once, but the spec has no [sweep]: remove \
                 --parallel"
            ))),
            None => Ok(None),
        };
    };
    if section.scheduler.is_some() {
        return Err(ManifestError::Spec(
            "the sweep has a [sweep.scheduler], which decides rung by rung which trials go on from all their \
             results, so it needs one sweep driver, not a job array of independent trials: remove \
             [sweep.scheduler], or run `trainrun sweep SPEC --parallel K` as one job"
                .into(),
        ));
    }
    if section.tpe.is_some() {
        return Err(ManifestError::Spec(
            "the sweep has a [sweep.tpe], which draws each trial after the start-up ones from the results before it, \
             so it needs one sweep driver, not a job array of independent trials: remove [sweep.tpe], or run \
             `trainrun sweep SPEC` as one job"
                .into(),
        ));
    }
    let seed = section.seed.unwrap_or(spec.run.seed);
    let trials = spec::sweep::expand(section, seed)
        .map_err(|diags| {
            let each: Vec<String> = diags.iter().map(|d| format!("{}: {}", d.key, d.message)).collect();
            ManifestError::Spec(each.join("; "))
        })?
        .len();
    let parallel = options.parallel.map_or(trials, |p| p.get().min(trials));
    Ok(Some(TrialArray { trials, parallel }))
}

/// Paths inside every container.
pub(crate) const SPEC_DIR: &str = "/etc/trainrun/spec";
pub(crate) const TLS_DIR: &str = "/etc/trainrun/tls";
pub(crate) const RUNS_DIR: &str = "/runs";
/// The binary in the image the Containerfile builds.
pub(crate) const BINARY: &str = "/trainrun";

/// What every target needs, derived once from the spec.
pub(crate) struct DeployJob {
    /// DNS-1123 name of the job, from `run.name`.
    pub name: String,
    /// The spec the tasks run.
    pub spec: Spec,
    /// Its TOML text.
    pub spec_toml: String,
    pub deploy: DeploySpec,
    /// Every task in rank order (one task for a one-process strategy).
    pub tasks: Vec<TaskId>,
    pub image: String,
    pub namespace: Option<String>,
    pub token: String,
    /// Seconds a task needs after SIGTERM: the step at hand (bounded by the collective
    /// timeout), then the chief's backup.
    pub grace_s: u64,
}

/// Why a manifest cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{0}")]
    Spec(String),
    #[error("cannot write the manifest: {0}")]
    Render(String),
}

/// `run.name` as a Kubernetes object name: lower case, `-` for anything else, short enough
/// that `<name>-<index>` and `<name>-worker-<index>` stay valid host names.
pub(crate) fn dns_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        let keep = c.is_ascii_lowercase() || c.is_ascii_digit();
        if keep {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out: String = out.trim_matches('-').chars().take(40).collect();
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() { "trainrun".to_owned() } else { out }
}

fn tls_in(dir: &str) -> TlsSpec {
    TlsSpec {
        cert_file: PathBuf::from(format!("{dir}/tls.crt")),
        key_file: PathBuf::from(format!("{dir}/tls.key")),
        ca_file: PathBuf::from(format!("{dir}/ca.crt")),
    }
}

fn job(spec: &Spec, target: Target, options: &Options) -> Result<DeployJob, ManifestError> {
    let multi = matches!(
        spec.strategy,
        spec::StrategySpec::MultiWorkerMirrored { .. } | spec::StrategySpec::ParameterServer { .. }
    );
    let scheduler = match target {
        Target::Kubernetes => "a Kubernetes Indexed Job",
        Target::Tfjob => "the TFJob operator",
        Target::Slurm => "Slurm",
    };
    let mut tasks = if multi {
        crate::cluster::kubernetes::tasks(&spec.cluster, scheduler).map_err(ManifestError::Spec)?
    } else {
        Vec::new()
    };
    if tasks.is_empty() {
        tasks.push(TaskId::new(Role::Worker, 0));
    }
    let name = dns_name(spec.run.name.as_deref().unwrap_or("trainrun"));
    let deploy = spec.deploy.clone().unwrap_or_default();
    let mut resolved = spec.clone();
    resolved.extends = None;
    resolved.run.name = Some(name.clone());
    resolved.cluster.token_file = None;
    match target {
        Target::Kubernetes | Target::Tfjob => {
            resolved.run.out_dir = Some(PathBuf::from(format!("{RUNS_DIR}/{name}")));
            if resolved.cluster.tls.is_some() {
                resolved.cluster.tls = Some(tls_in(TLS_DIR));
            }
        }
        Target::Slurm => {}
    }
    let spec_toml = toml::to_string_pretty(&resolved).map_err(|e| ManifestError::Render(e.to_string()))?;
    let timeout_s = match &spec.strategy {
        spec::StrategySpec::MultiWorkerMirrored { communication, .. } => communication.timeout_s,
        _ => spec::CommunicationOptions::default().timeout_s,
    };
    if let Some(ns) = &options.namespace {
        check_namespace(ns)?;
    }
    if let Some(image) = &options.image {
        check_image(image)?;
    }
    let image = (options.image.clone().or_else(|| deploy.image.clone()))
        .unwrap_or_else(|| format!("trainrun:{}", env!("CARGO_PKG_VERSION")));
    Ok(DeployJob {
        name,
        spec: resolved,
        spec_toml,
        deploy,
        tasks,
        image,
        namespace: options.namespace.clone(),
        token: options.token.clone(),
        grace_s: timeout_s.ceil() as u64 + 30,
    })
}

/// A namespace is an RFC 1123 label: the API server refuses anything else, so say so before
/// anything is applied.
fn check_namespace(ns: &str) -> Result<(), ManifestError> {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok = ns.len() <= 63
        && edge(ns.chars().next())
        && edge(ns.chars().last())
        && ns.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        return Ok(());
    }
    Err(ManifestError::Spec(format!(
        "--namespace {ns:?} is not a Kubernetes namespace name: use at most 63 lowercase letters, digits and '-', \
         starting and ending with a letter or digit, e.g. `--namespace ml-team`"
    )))
}

/// An image reference has no spaces and does not end in its tag's or digest's separator; a
/// pod with a malformed one fails only once scheduled (`InvalidImageName`).
fn check_image(image: &str) -> Result<(), ManifestError> {
    if !image.is_empty() && !image.chars().any(char::is_whitespace) && !image.ends_with([':', '@', '/']) {
        return Ok(());
    }
    Err(ManifestError::Spec(format!(
        "--image {image:?} is not a container image reference: write `registry/name:tag` without spaces, \
         e.g. `--image registry.example.com/trainrun:{}`",
        env!("CARGO_PKG_VERSION")
    )))
}

/// The manifest text for `target`.
pub fn render(spec: &Spec, target: Target, options: &Options) -> Result<String, ManifestError> {
    let array = trial_array(spec, options)?;
    let job = job(spec, target, options)?;
    match (target, array) {
        (Target::Kubernetes, None) => kubernetes::render(&job),
        (Target::Tfjob, None) => tfjob::render(&job),
        (Target::Slurm, None) => slurm::render(&job),
        (Target::Kubernetes, Some(array)) => kubernetes::render_sweep(&job, array),
        (Target::Slurm, Some(array)) => slurm::render_array(&job, array),
        (Target::Tfjob, Some(_)) => Err(ManifestError::Spec(
            "a sweep runs its trials as a job array, one index per trial, which a TFJob cannot express: use \
             `--for kubernetes` (an Indexed Job) or `--for slurm` (a job array)"
                .into(),
        )),
    }
}

/// YAML documents, `---` between them.
pub(crate) fn yaml(documents: &[serde_json::Value]) -> Result<String, ManifestError> {
    let mut out = String::new();
    for (i, d) in documents.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_norway::to_string(d).map_err(|e| ManifestError::Render(e.to_string()))?);
    }
    Ok(out)
}

/// CPU each task requests: `deploy.cpu`, else `run.threads`.
pub(crate) fn cpu(job: &DeployJob) -> Option<String> {
    job.deploy.cpu.clone().or_else(|| job.spec.run.threads.map(|t| t.to_string()))
}

/// `trainrun manifest`: loads and checks the spec, then prints the manifest.
pub fn run(
    inv: &Invocation,
    target: Target,
    image: Option<String>,
    namespace: Option<String>,
    parallel: Option<NonZeroUsize>,
) -> Result<(), RunError> {
    let loaded = spec::load(&inv.spec, &inv.env, &inv.sets).map_err(|e| RunError::Spec(e.to_string()))?;
    // A sweep's problems, located, before its job array is written.
    if let Err(diags) = crate::sweep::Sweep::new(&loaded) {
        return Err(RunError::Spec(spec::render(&diags, &loaded.origins)));
    }
    // Plan as the pods will: from the spec's [cluster], not this machine's scheduler.
    let scheduler = |k: &str| {
        k == "TF_CONFIG"
            || k.starts_with("SLURM_")
            || k == crate::cluster::kubernetes::INDEX_VAR
            || k == "TRAINRUN_TASK"
    };
    let env = inv.env.iter().filter(|(k, _)| !scheduler(k)).cloned().collect();
    // As the chief's pod would (every task plans alike): a cluster of addresses on other hosts
    // then plans here too, and the target says what it makes of them.
    let multi = crate::plan::StrategyKind::of(&loaded.spec.strategy).multi_process();
    let chief = crate::cluster::resolve::roles(&loaded.spec.cluster)
        .into_iter()
        .find(|(_, tasks)| multi && tasks.is_some())
        .map(|(role, _)| TaskId::new(role, 0).to_string());
    let here = Invocation { env, task: chief, ..inv.clone() };
    match crate::prepare::plan(&loaded, &here) {
        Ok(_) => {}
        Err(Unplanned::Spec(diags)) => return Err(RunError::Spec(spec::render(&diags, &loaded.origins))),
        // The data need not be on this machine, nor fit its memory: the pods have their own.
        Err(Unplanned::Run(_) | Unplanned::TooBig(_)) => {}
    }
    let token = crate::cluster::new_job_token().map_err(|e| RunError::Failure(e.to_string()))?;
    let options = Options { image, namespace, token: token.as_str().to_owned(), parallel };
    let text = render(&loaded.spec, target, &options).map_err(|e| match e {
        ManifestError::Spec(m) => RunError::Spec(format!("error: {m}")),
        ManifestError::Render(m) => RunError::Failure(m),
    })?;
    print!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_become_dns_names() {
        assert_eq!(dns_name("mnist_multiworker"), "mnist-multiworker");
        assert_eq!(dns_name("__A.b__"), "a-b");
        assert_eq!(dns_name("%%%"), "trainrun");
        assert_eq!(dns_name(&"x".repeat(80)).len(), 40);
    }

    #[test]
    fn namespaces_and_images_the_cluster_would_refuse_are_refused_here() {
        for good in ["default", "ml-team", "a", "team-2"] {
            assert!(check_namespace(good).is_ok(), "{good}");
        }
        for bad in ["My_NS", "-team", "team-", "", "a.b", &"x".repeat(64)] {
            let Err(ManifestError::Spec(m)) = check_namespace(bad) else { panic!("{bad:?} accepted") };
            assert!(m.starts_with(&format!("--namespace {bad:?} is not a Kubernetes namespace name")), "{m}");
        }
        for good in ["trainrun:0.1.0", "registry.example.com:5000/ml/trainrun@sha256:abc", "trainrun"] {
            assert!(check_image(good).is_ok(), "{good}");
        }
        for bad in ["", "bad image", "trainrun:", "trainrun@", "registry/"] {
            assert!(matches!(check_image(bad), Err(ManifestError::Spec(_))), "{bad:?} accepted");
        }
    }
}
