//! Loading a spec: the file and its `extends` chain, then environment and `--set` overrides,
//! merged with figment, validated against the schema (every problem at once), and only then
//! deserialized into [`Spec`].

use super::files::{self, SpecFile, Unreadable, io_reason, table_to_dict};
use super::keypath::{self, Seg};
use super::origins::{self, LayerKind, Origins, SpecLayer, SweepAt};
use super::overrides::{self, BadOverride, Override};
use super::render::{Finding, Place, render_findings, render_parts};
use super::{Spec, validate};
use crate::diagnostic::{Diagnostic, Severity};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};
use std::path::{Path, PathBuf};
use toml::de::DeTable;

/// A spec that loaded and validated.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The merged, typed spec. `run.name` is the top file's stem unless a layer set it.
    pub spec: Spec,
    /// The files read: the one named first, then each file it extends, in chain order.
    pub files: Vec<PathBuf>,
    /// Where every value came from, to render later diagnostics (the planner's) with
    /// [`render`](super::render).
    pub origins: Origins,
}

/// Why a spec did not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The named spec file could not be read.
    #[error("error: cannot read `{}`: {}", path.display(), io_reason(source))]
    Read {
        /// The path as given.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The spec has problems; `rendered` shows every one of them with its location and ends
    /// with a summary line.
    #[error("{rendered}")]
    Invalid {
        /// The problems, keyed by path.
        diagnostics: Vec<Diagnostic>,
        /// The problems as text, ready to print.
        rendered: String,
        /// Each problem as text, without the summary line (a sweep merges its trials' problems).
        parts: Vec<String>,
    },
}

impl LoadError {
    /// The problems, keyed by path (empty for [`LoadError::Read`]).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            LoadError::Read { .. } => &[],
            LoadError::Invalid { diagnostics, .. } => diagnostics,
        }
    }

    fn invalid(findings: Vec<Finding>, origins: &Origins) -> Self {
        LoadError::Invalid {
            rendered: render_findings(&findings, origins),
            parts: render_parts(&findings, origins),
            diagnostics: findings.into_iter().map(|f| f.diag).collect(),
        }
    }
}

/// Loads the spec at `path` with its `extends` chain, then overrides from `env` (the process
/// environment, passed in: `TRAINRUN_<SECTION>__<KEY>=VALUE`) and from `sets` (`--set` values,
/// `KEY=VALUE`), lowest to highest precedence: base files (deepest first), the file, the
/// environment, `--set` in order.
pub fn load(path: &Path, env: &[(String, String)], sets: &[String]) -> Result<Loaded, LoadError> {
    load_layers(path, env, sets, &[])
}

/// One value a sweep trial sets: a key path, its value, and where the spec's `[sweep]` gives
/// it, so that its problems point there.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The key path it sets, written as for `--set`: `optimizer.learning_rate`.
    pub key: String,
    /// The value.
    pub value: serde_json::Value,
    /// Where the sweep gives it, as a key path: `sweep.grid."optimizer.learning_rate"[1]`.
    pub source: String,
}

/// Loads one trial of a sweep: [`load`], then `trial`'s values on top of every other layer,
/// through the same machinery as `--set` (so a bad key gets the same "did you mean", pointing
/// at the sweep). The trial's spec has no `[sweep]`: it is an ordinary run.
pub fn load_trial(
    path: &Path,
    env: &[(String, String)],
    sets: &[String],
    trial: &[Assignment],
) -> Result<Loaded, LoadError> {
    let mut loaded = load_layers(path, env, sets, trial)?;
    loaded.spec.sweep = None;
    Ok(loaded)
}

/// A trial value as an override, and where its sweep entry is written.
fn trial_override(a: &Assignment, files: &[(usize, &str)]) -> (Result<Override, BadOverride>, Option<SweepAt>) {
    let source = keypath::parse(&a.source).unwrap_or_default();
    // The key of a grid value is its list's key.
    let owner = match source.split_last() {
        Some((Seg::Index(_), owner)) => owner,
        _ => source.as_slice(),
    };
    let at = files.iter().rev().find_map(|&(file, text)| {
        let (key, value) = origins::spans(text, &source)?;
        let key = key.or_else(|| origins::spans(text, owner).and_then(|(k, _)| k));
        Some(SweepAt { file, key, value: Some(value) })
    });
    let name = format!("[sweep] {} = {}", a.key, a.value);
    let parsed = match keypath::parse(&a.key) {
        Ok(segs) if !segs.is_empty() => Ok(Override { name, segs, value: json_value(&a.value) }),
        Ok(_) => Err(BadOverride {
            message: format!("cannot apply the sweep's `{}`: the key is empty", a.source),
            help: "name a key path, e.g. `\"optimizer.learning_rate\" = [0.1, 0.01]`".to_string(),
            name,
        }),
        Err(why) => Err(BadOverride {
            message: format!("cannot apply the sweep's `{}`: {why}", a.key),
            help: "write key paths as for `--set`, e.g. `\"model.layers[1].units\" = [64, 128]`".to_string(),
            name,
        }),
    };
    (parsed, at)
}

/// A JSON value as figment's.
fn json_value(json: &serde_json::Value) -> Value {
    use figment::value::{Num, Tag};
    match json {
        serde_json::Value::Null => Value::from(String::new()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::Num(Tag::Default, Num::I64(i)),
            (None, Some(u), _) => Value::Num(Tag::Default, Num::U64(u)),
            (None, None, f) => Value::Num(Tag::Default, Num::F64(f.unwrap_or(f64::NAN))),
        },
        serde_json::Value::String(s) => Value::from(s.clone()),
        serde_json::Value::Array(items) => Value::Array(Tag::Default, items.iter().map(json_value).collect()),
        serde_json::Value::Object(map) => {
            Value::Dict(Tag::Default, map.iter().map(|(k, v)| (k.clone(), json_value(v))).collect())
        }
    }
}

fn load_layers(
    path: &Path,
    env: &[(String, String)],
    sets: &[String],
    trial: &[Assignment],
) -> Result<Loaded, LoadError> {
    let chain = match files::read_chain(path) {
        Err(Unreadable { path, error }) => {
            return Err(LoadError::Read { path, source: error });
        }
        Ok(Err(problem)) => {
            let (origins, findings) = problem.into_findings();
            return Err(LoadError::invalid(findings, &origins));
        }
        Ok(Ok(chain)) => chain,
    };

    let mut layers: Vec<SpecLayer> = Vec::new();
    let mut figment = Figment::new();
    for file in chain.iter().rev() {
        figment = figment.merge(file_layer(file));
        layers.push(file.layer());
    }

    let files: Vec<(usize, &str)> = chain.iter().rev().enumerate().map(|(i, f)| (i, f.source.as_str())).collect();
    let mut findings = Vec::new();
    let parsed = overrides::from_env(env, validate::homes())
        .into_iter()
        .chain(sets.iter().map(|s| overrides::from_set(s)))
        .map(|p| (p, None))
        .chain(trial.iter().map(|a| trial_override(a, &files)).map(|(p, at)| (p, Some(at))));
    for (parsed, sweep) in parsed {
        let applied = parsed.and_then(|ov| {
            let below = merged(&figment);
            let data = overrides::layer_data(&ov, &below)?;
            Ok((ov, data))
        });
        let kind = |segs: Vec<Seg>| match &sweep {
            Some(at) => LayerKind::Sweep { segs, at: at.clone() },
            None => LayerKind::Override { segs },
        };
        match applied {
            Ok((ov, data)) => {
                figment = figment.merge(LayerData {
                    metadata: Metadata::from(ov.name.clone(), Source::Custom(ov.name.clone())),
                    data,
                });
                layers.push(SpecLayer { name: ov.name, kind: kind(ov.segs) });
            }
            Err(BadOverride { name, message, help }) => {
                let mut finding = Finding::new("", message).help(help);
                finding.place = match sweep.as_ref().and_then(|at| at.as_ref()) {
                    Some(at) => Place::Layer { layer: at.file, span: at.key.clone().or_else(|| at.value.clone()) },
                    None => Place::Layer { layer: layers.len(), span: None },
                };
                findings.push(finding);
                layers.push(SpecLayer { name, kind: kind(Vec::new()) });
            }
        }
    }

    let origins = Origins::merged(layers, merged(&figment), &figment);
    findings.extend(validate::validate(origins.value()));
    if findings.iter().any(|f| f.diag.severity == Severity::Error) {
        return Err(LoadError::invalid(findings, &origins));
    }

    let mut spec: Spec = match figment.extract() {
        Ok(spec) => spec,
        Err(errors) => {
            let findings = errors.into_iter().map(|e| Finding::new(e.path.join("."), e.kind.to_string())).collect();
            return Err(LoadError::invalid(findings, &origins));
        }
    };
    if spec.run.name.is_none() {
        spec.run.name = path.file_stem().map(|stem| stem.to_string_lossy().into_owned());
    }
    // The chain is merged in (`Loaded::files` lists it): the resolved spec stands alone, so
    // the `spec.toml` a run writes runs again from anywhere.
    spec.extends = None;
    Ok(Loaded { spec, files: chain.into_iter().map(|f| f.path).collect(), origins })
}

/// The value merged so far. Only our own providers are merged and they cannot fail, so an
/// error here would be a figment bug; an empty spec then lets validation report what is
/// missing rather than panicking.
fn merged(figment: &Figment) -> Value {
    figment.extract::<Value>().unwrap_or_else(|_| Value::from(Dict::new()))
}

fn file_layer(file: &SpecFile) -> LayerData {
    let (table, _) = DeTable::parse_recoverable(&file.source);
    LayerData {
        metadata: Metadata::from(file.path.display().to_string(), Source::File(file.path.clone())),
        data: table_to_dict(table.get_ref()),
    }
}

/// One layer's values, named by its metadata so each merged value's tag tells its origin.
struct LayerData {
    metadata: Metadata,
    data: Dict,
}

impl Provider for LayerData {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.data.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Writes `files` (name, text) into a fresh folder and returns it.
    fn folder(files: &[(&str, &str)]) -> tempfile::TempDir {
        let Ok(dir) = tempfile::tempdir() else { panic!("no temporary folder") };
        for (name, text) in files {
            let path = dir.path().join(name);
            if let Some(parent) = path.parent() {
                let _ = fs::create_dir_all(parent);
            }
            if fs::write(&path, text).is_err() {
                panic!("cannot write {name}")
            }
        }
        dir
    }

    fn loaded(path: &Path, env: &[(&str, &str)], sets: &[&str]) -> Loaded {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        match load(path, &env, &sets) {
            Ok(loaded) => loaded,
            Err(error) => panic!("{error}"),
        }
    }

    fn rendered(result: Result<Loaded, LoadError>) -> String {
        match result {
            Ok(loaded) => panic!("should fail: {:?}", loaded.spec),
            Err(error) => error.to_string(),
        }
    }

    const BASE: &str = "[model]\nzoo = \"mnist_cnn\"\n\n[train]\nepochs = 1\nsteps_per_epoch = 10\n\
                        validation_steps = 5\nevaluate_every_steps = 3\n";
    const FILE: &str = "extends = \"base.toml\"\n[train]\nsteps_per_epoch = 20\n\
                        validation_steps = 6\nevaluate_every_steps = 4\n";

    #[test]
    fn layers_take_precedence_base_file_env_set() {
        let dir = folder(&[("base.toml", BASE), ("spec.toml", FILE)]);
        let spec_path = dir.path().join("spec.toml");
        let env = [("TRAINRUN_TRAIN__VALIDATION_STEPS", "7"), ("TRAINRUN_TRAIN__EVALUATE_EVERY_STEPS", "8")];
        let spec = loaded(&spec_path, &env, &["train.evaluate_every_steps=9"]).spec;
        assert_eq!(spec.train.epochs.get(), 1, "base");
        assert_eq!(spec.train.steps_per_epoch.map(|n| n.get()), Some(20), "file over base");
        assert_eq!(spec.train.validation_steps.map(|n| n.get()), Some(7), "env over file");
        assert_eq!(spec.train.evaluate_every_steps.map(|n| n.get()), Some(9), "--set over env");
        let later = loaded(&spec_path, &[], &["train.epochs=2", "train.epochs=3"]).spec;
        assert_eq!(later.train.epochs.get(), 3, "the last --set wins");
    }

    #[test]
    fn origins_name_each_layer() {
        let dir = folder(&[("base.toml", BASE), ("spec.toml", FILE)]);
        let spec_path = dir.path().join("spec.toml");
        let env = [("TRAINRUN_TRAIN__VALIDATION_STEPS", "7")];
        let origins = loaded(&spec_path, &env, &["train.evaluate_every_steps=9"]).origins;
        let name = |key: &str| origins.origin(key).unwrap_or_default().to_string();
        assert!(name("train.epochs").ends_with("base.toml"));
        assert!(name("train.steps_per_epoch").ends_with("spec.toml"));
        assert_eq!(name("train.validation_steps"), "environment variable TRAINRUN_TRAIN__VALIDATION_STEPS");
        assert_eq!(name("train.evaluate_every_steps"), "--set train.evaluate_every_steps=9");
        assert!(name("batch.global").ends_with("spec.toml"), "defaults: the top file");
    }

    #[test]
    fn extends_is_relative_to_the_extending_file() {
        let dir = folder(&[
            ("specs/base/common.toml", BASE),
            ("specs/base/mid.toml", "extends = \"common.toml\"\n[batch]\nglobal = 32\n"),
            ("specs/exp/run.toml", "extends = \"../base/mid.toml\"\n"),
        ]);
        let top = dir.path().join("specs/exp/run.toml");
        let loaded = loaded(&top, &[], &[]);
        let names: Vec<String> =
            loaded.files.iter().filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
        assert_eq!(names, ["run.toml", "mid.toml", "common.toml"]);
        assert_eq!(loaded.files[1], dir.path().join("specs/base/mid.toml"));
        assert_eq!(loaded.spec.batch.global.map(|n| n.get()), Some(32));
        assert_eq!(loaded.spec.run.name.as_deref(), Some("run"), "the top file's stem");
    }

    #[test]
    fn cycles_name_the_chain() {
        let dir = folder(&[("a.toml", "extends = \"b.toml\"\n"), ("b.toml", "extends = \"./a.toml\"\n")]);
        let text = rendered(load(&dir.path().join("a.toml"), &[], &[]));
        let a = dir.path().join("a.toml").display().to_string();
        let b = dir.path().join("b.toml").display().to_string();
        assert!(text.contains(&format!("{a} → {b} → {a}")), "{text}");
        let own = folder(&[("self.toml", "extends = \"self.toml\"\n")]);
        let text = rendered(load(&own.path().join("self.toml"), &[], &[]));
        assert!(text.contains("forms a cycle"), "{text}");
    }

    #[test]
    fn trial_values_layer_last_and_their_problems_point_at_the_sweep() {
        let sweep = "extends = \"base.toml\"\n[sweep.grid]\n\"train.steps_per_epoch\" = [30, 0]\n\
                     \"train.validatoin_steps\" = [2]\n";
        let dir = folder(&[("base.toml", BASE), ("sweep.toml", sweep)]);
        let path = dir.path().join("sweep.toml");
        let value = |key: &str, value: serde_json::Value, source: &str| Assignment {
            key: key.into(),
            value,
            source: source.into(),
        };
        let good = [value("train.steps_per_epoch", 30.into(), "sweep.grid.\"train.steps_per_epoch\"[0]")];
        let Ok(trial) = load_trial(&path, &[], &["train.steps_per_epoch=7".into()], &good) else {
            panic!("the trial loads")
        };
        assert_eq!(trial.spec.train.steps_per_epoch.map(|n| n.get()), Some(30), "the trial's value wins");
        assert!(trial.spec.sweep.is_none(), "a trial is an ordinary run");
        assert!(trial.origins.origin("train.steps_per_epoch").is_some_and(|o| o.ends_with("sweep.toml")));

        let bad = [
            value("train.steps_per_epoch", 0.into(), "sweep.grid.\"train.steps_per_epoch\"[1]"),
            value("train.validatoin_steps", 2.into(), "sweep.grid.\"train.validatoin_steps\"[0]"),
        ];
        let text = rendered(load_trial(&path, &[], &[], &bad));
        assert!(text.contains("sweep.toml:3:32"), "the zero in the grid: {text}");
        assert!(text.contains("sweep.toml:4:1") && text.contains("did you mean `validation_steps`?"), "{text}");
    }

    #[test]
    fn a_missing_top_file_is_a_read_error() {
        let dir = folder(&[]);
        let error = load(&dir.path().join("nope.toml"), &[], &[]);
        assert!(matches!(error, Err(LoadError::Read { .. })));
    }
}
