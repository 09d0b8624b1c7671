//! Loading a spec: the file and its `extends` chain, then environment and `--set` overrides,
//! merged with figment, validated against the schema (every problem at once), and only then
//! deserialized into [`Spec`].

use super::diag::{Diagnostic, Severity};
use super::files::{self, SpecFile, Unreadable, io_reason, table_to_dict};
use super::origins::{Layer, LayerKind, Origins};
use super::overrides::{self, BadOverride};
use super::render::{Finding, Place, render_findings};
use super::{Spec, schema_value, validate};
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
            diagnostics: findings.into_iter().map(|f| f.diag).collect(),
        }
    }
}

/// Loads the spec at `path` with its `extends` chain, then overrides from `env` (the process
/// environment, passed in: `TRAINRUN_<SECTION>__<KEY>=VALUE`) and from `sets` (`--set` values,
/// `KEY=VALUE`), lowest to highest precedence: base files (deepest first), the file, the
/// environment, `--set` in order.
pub fn load(path: &Path, env: &[(String, String)], sets: &[String]) -> Result<Loaded, LoadError> {
    let chain = match files::read_chain(path) {
        Err(Unreadable { path, error }) => {
            return Err(LoadError::Read {
                path,
                source: error,
            });
        }
        Ok(Err(problem)) => {
            let (origins, findings) = problem.into_findings();
            return Err(LoadError::invalid(findings, &origins));
        }
        Ok(Ok(chain)) => chain,
    };

    let mut layers: Vec<Layer> = Vec::new();
    let mut figment = Figment::new();
    for file in chain.iter().rev() {
        figment = figment.merge(file_layer(file));
        layers.push(file.layer());
    }

    let mut findings = Vec::new();
    let parsed = overrides::from_env(env)
        .into_iter()
        .chain(sets.iter().map(|s| overrides::from_set(s)));
    for parsed in parsed {
        let applied = parsed.and_then(|ov| {
            let below = merged(&figment);
            let data = overrides::layer_data(&ov, &below)?;
            Ok((ov, data))
        });
        match applied {
            Ok((ov, data)) => {
                figment = figment.merge(LayerData {
                    metadata: Metadata::from(ov.name.clone(), Source::Custom(ov.name.clone())),
                    data,
                });
                layers.push(Layer {
                    name: ov.name,
                    kind: LayerKind::Override { segs: ov.segs },
                });
            }
            Err(BadOverride {
                name,
                message,
                help,
            }) => {
                let mut finding = Finding::new("", message).help(help);
                finding.place = Place::Layer {
                    layer: layers.len(),
                    span: None,
                };
                findings.push(finding);
                layers.push(Layer {
                    name,
                    kind: LayerKind::Override { segs: Vec::new() },
                });
            }
        }
    }

    let origins = Origins::merged(layers, merged(&figment), &figment);
    findings.extend(validate::validate(origins.value(), &schema_value()));
    if findings.iter().any(|f| f.diag.severity == Severity::Error) {
        return Err(LoadError::invalid(findings, &origins));
    }

    let mut spec: Spec = match figment.extract() {
        Ok(spec) => spec,
        Err(errors) => {
            let findings = errors
                .into_iter()
                .map(|e| Finding::new(e.path.join("."), e.kind.to_string()))
                .collect();
            return Err(LoadError::invalid(findings, &origins));
        }
    };
    if spec.run.name.is_none() {
        spec.run.name = path
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned());
    }
    Ok(Loaded {
        spec,
        files: chain.into_iter().map(|f| f.path).collect(),
        origins,
    })
}

/// The value merged so far. Only our own providers are merged and they cannot fail, so an
/// error here would be a figment bug; an empty spec then lets validation report what is
/// missing rather than panicking.
fn merged(figment: &Figment) -> Value {
    figment
        .extract::<Value>()
        .unwrap_or_else(|_| Value::from(Dict::new()))
}

fn file_layer(file: &SpecFile) -> LayerData {
    let (table, _) = DeTable::parse_recoverable(&file.source);
    LayerData {
        metadata: Metadata::from(
            file.path.display().to_string(),
            Source::File(file.path.clone()),
        ),
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
