//! Overrides of single keys: `TRAINRUN_<SECTION>__<KEY>` environment variables and
//! `--set a.b.c=VALUE` arguments. Each becomes one figment layer named after itself.

use super::files::to_value;
use super::keypath::{self, Seg};
use super::words::closest;
use figment::value::{Dict, Tag, Value};
use std::collections::BTreeMap;
use toml::de::DeValue;

/// One override, parsed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Override {
    /// The layer's name: `--set a.b=1` as given, or `environment variable NAME`.
    pub name: String,
    /// The key path it sets.
    pub segs: Vec<Seg>,
    /// The value it sets.
    pub value: Value,
}

/// An override that could not be parsed or applied: its layer name and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BadOverride {
    pub name: String,
    pub message: String,
    pub help: String,
}

const PREFIX: &str = "TRAINRUN_";

/// The variables trainrun reads besides spec overrides (docs/specs.md, "Layering", and docs/reliability.md
/// name them). Any other `TRAINRUN_*` name without `__` is a mistake, reported like an
/// unknown key.
pub(crate) const KNOWN_VARIABLES: [&str; 13] = [
    "TRAINRUN_DATA_DIR",
    // The inflated-file cache's folder (`DataDirs::data_cache`), which a sweep sets for its trials.
    "TRAINRUN_DATA_CACHE",
    // The token cache's folder (`DataDirs::token_cache`).
    "TRAINRUN_TOKEN_CACHE",
    // The memory to plan for instead of the machine's (`machine_memory::LIMIT_VAR`).
    "TRAINRUN_MEMORY_LIMIT",
    "TRAINRUN_OFFLINE",
    "TRAINRUN_TASK",
    "TRAINRUN_JOB_TOKEN",
    "TRAINRUN_PROGRESS",
    "TRAINRUN_SWEEP_TRIAL",
    // The control socket a sweep hands a trial that may stay resident (`sweep::resident`).
    "TRAINRUN_SWEEP_CONTROL",
    // A tracked sweep's MLflow run, which its trials log under (`tracking::PARENT_VAR`).
    "TRAINRUN_MLFLOW_PARENT",
    // The headless Service of a Kubernetes Indexed Job (`cluster::kubernetes::SERVICE_VAR`).
    "TRAINRUN_KUBERNETES_SERVICE",
    // The control-plane listener the local launcher bound and handed down (`cluster::launch`).
    "TRAINRUN_CONTROL_FD",
];

/// `trainrun bench` describes its all-reduce peers' part with variables of this prefix.
const INTERNAL_PREFIX: &str = "TRAINRUN_COLLECTIVE_";

/// The spec overrides among environment variables, sorted by name so the result does not
/// depend on the environment's order, and an error for each unknown `TRAINRUN_*` variable
/// (with a "did you mean" from `homes`, where each key of the spec lives). The variables
/// trainrun reads for other things ([`KNOWN_VARIABLES`]) are skipped.
pub(crate) fn from_env(
    env: &[(String, String)],
    homes: &BTreeMap<String, Vec<String>>,
) -> Vec<Result<Override, BadOverride>> {
    let mut vars: Vec<&(String, String)> = env
        .iter()
        .filter(|(name, _)| name.get(..PREFIX.len()).is_some_and(|p| p.eq_ignore_ascii_case(PREFIX)))
        .filter(|(name, _)| !KNOWN_VARIABLES.contains(&name.as_str()) && !name.starts_with(INTERNAL_PREFIX))
        .collect();
    vars.sort();
    vars.into_iter()
        .map(|(name, value)| match name[PREFIX.len()..].contains("__") {
            true => env_override(name, value),
            false => Err(unknown_variable(name, homes)),
        })
        .collect()
}

/// `TRAINRUN_` and the key path in capitals, `__` between keys.
fn variable_for(path: &str) -> String {
    let keys: Vec<String> = path.split('.').map(str::to_ascii_uppercase).collect();
    format!("{PREFIX}{}", keys.join("__"))
}

/// A `TRAINRUN_*` variable trainrun does not read: the closest known variable, else the
/// override of the key it seems to name (`TRAINRUN_LEARNING_RATE`,
/// `TRAINRUN_OPTIMIZER_LEARNING_RATE` → `TRAINRUN_OPTIMIZER__LEARNING_RATE`).
fn unknown_variable(var: &str, homes: &BTreeMap<String, Vec<String>>) -> BadOverride {
    let rest = var[PREFIX.len()..].to_ascii_lowercase();
    let paths = |key: &str| -> Vec<String> {
        let sections = homes.get(key).map(Vec::as_slice).unwrap_or_default();
        sections.iter().filter(|s| !s.is_empty()).map(|s| format!("{s}.{key}")).collect()
    };
    // The key with its section joined by one `_` instead of `__`.
    let joined = homes.iter().find_map(|(key, sections)| {
        sections
            .iter()
            .filter(|s| !s.is_empty())
            .find(|s| format!("{}_{key}", s.replace('.', "_")) == rest)
            .map(|s| vec![format!("{s}.{key}")])
    });
    let exact = joined.or_else(|| Some(paths(&rest)).filter(|p| !p.is_empty()));
    // Compared without the common prefix, which would make every name look alike.
    let suffixes = KNOWN_VARIABLES.map(|k| &k[PREFIX.len()..]);
    let known = closest(&rest, suffixes).map(|k| format!("{PREFIX}{k}")).filter(|k| k != var);
    let overrides = match (exact, &known) {
        (Some(exact), _) => exact,
        (None, Some(_)) => Vec::new(),
        (None, None) => closest(&rest, homes.keys().map(String::as_str)).map(paths).unwrap_or_default(),
    };
    let listed: Vec<String> = overrides.iter().take(3).map(|p| format!("`{}`", variable_for(p))).collect();
    let help = match (known, listed.is_empty()) {
        (_, false) => format!(
            "did you mean {}? Spec overrides name the section and the key, with `__` between them",
            listed.join(" or ")
        ),
        (Some(k), true) => format!("did you mean `{k}`?"),
        (None, true) => format!(
            "trainrun reads {}, and spec overrides `TRAINRUN_<SECTION>__<KEY>` (e.g. \
             `TRAINRUN_OPTIMIZER__LEARNING_RATE=0.1`); rename or unset this one",
            KNOWN_VARIABLES.join(", ")
        ),
    };
    BadOverride {
        name: format!("environment variable {var}"),
        message: format!("unknown environment variable `{var}`: trainrun reads no such variable"),
        help,
    }
}

fn env_override(var: &str, value: &str) -> Result<Override, BadOverride> {
    let name = format!("environment variable {var}");
    let mut segs = Vec::new();
    for part in var[PREFIX.len()..].split("__") {
        let key = part.to_ascii_lowercase();
        if !keypath::is_bare(&key) {
            let what = if key.is_empty() {
                "an empty key between `__` separators".to_string()
            } else {
                format!("`{part}`, which is not a key name")
            };
            return Err(BadOverride {
                message: format!("cannot apply environment variable `{var}`: it has {what}"),
                help: "name spec overrides `TRAINRUN_<SECTION>__<KEY>`, with `__` between \
                       keys, e.g. `TRAINRUN_OPTIMIZER__LEARNING_RATE=0.1`"
                    .to_string(),
                name,
            });
        }
        segs.push(Seg::Key(key));
    }
    checked(Override { name, segs, value: parse_value(value) })
}

/// Parses one `--set KEY=VALUE` argument.
pub(crate) fn from_set(text: &str) -> Result<Override, BadOverride> {
    let name = format!("--set {text}");
    let bad = |message: String| BadOverride {
        name: name.clone(),
        message: format!("cannot apply `--set {text}`: {message}"),
        help: "write `--set KEY=VALUE`, e.g. `--set optimizer.learning_rate=0.1` or \
               `--set model.layers[1].units=64`"
            .to_string(),
    };
    let Some((key, value)) = text.split_once('=') else {
        return Err(bad("it has no `=` between key and value".to_string()));
    };
    if key.trim().is_empty() {
        return Err(bad("the key before `=` is empty".to_string()));
    }
    let segs = keypath::parse(key).map_err(bad)?;
    checked(Override { name: name.clone(), segs, value: parse_value(value) })
}

fn checked(ov: Override) -> Result<Override, BadOverride> {
    if ov.segs.first() == Some(&Seg::Key("extends".to_string())) {
        return Err(BadOverride {
            message: format!("cannot apply {}: `extends` is only read from spec files", quoted(&ov.name)),
            help: "write `extends = \"base.toml\"` in the spec file instead".to_string(),
            name: ov.name,
        });
    }
    Ok(ov)
}

fn quoted(name: &str) -> String {
    match name.strip_prefix("environment variable ") {
        Some(var) => format!("environment variable `{var}`"),
        None => format!("`{name}`"),
    }
}

/// An override's value: TOML (`0.1`, `true`, `[1, 2]`, `"x"`), else the text as a string,
/// so `--set run.name=foo` needs no quotes.
pub(crate) fn parse_value(text: &str) -> Value {
    let text = text.trim();
    match DeValue::parse(text) {
        Ok(value) => to_value(value.get_ref()),
        Err(_) => Value::from(text.to_string()),
    }
}

/// The data of the override's layer, given the value merged from the layers below it.
/// Tables merge key by key, but figment replaces arrays whole: an override inside an array
/// item (`model.layers[1].units`) copies the array below, whose items keep their origins,
/// and changes the one value.
pub(crate) fn layer_data(ov: &Override, below: &Value) -> Result<Dict, BadOverride> {
    let segs = resolve_indices(&ov.segs, below);
    match sparse(&segs, 0, Some(below), ov.value.clone()) {
        Ok(Value::Dict(_, dict)) => Ok(dict),
        Ok(_) => Ok(Dict::new()),
        Err(why) => Err(BadOverride {
            message: format!("cannot apply {}: {why}", quoted(&ov.name)),
            help: "an override can change an existing list item or replace the whole list, \
                   e.g. `--set train.metrics=[\"accuracy\"]`"
                .to_string(),
            name: ov.name.clone(),
        }),
    }
}

/// Numeric keys that address an existing array are indices (`TRAINRUN_MODEL__LAYERS__1__UNITS`).
fn resolve_indices(segs: &[Seg], below: &Value) -> Vec<Seg> {
    let mut node = Some(below);
    segs.iter()
        .map(|seg| {
            let seg = match (seg, node) {
                (Seg::Key(k), Some(Value::Array(..))) => k.parse().map_or_else(|_| seg.clone(), Seg::Index),
                _ => seg.clone(),
            };
            node = match (&seg, node) {
                (Seg::Key(k), Some(Value::Dict(_, d))) => d.get(k),
                (Seg::Index(i), Some(Value::Array(_, items))) => items.get(*i),
                _ => None,
            };
            seg
        })
        .collect()
}

/// Nested tables holding only the override, until an array index; from there, a copy.
fn sparse(segs: &[Seg], depth: usize, below: Option<&Value>, value: Value) -> Result<Value, String> {
    match segs.get(depth) {
        None => Ok(value),
        Some(Seg::Key(key)) => {
            let child = below.and_then(Value::as_dict).and_then(|d| d.get(key));
            let inner = sparse(segs, depth + 1, child, value)?;
            Ok(Value::Dict(Tag::Default, Dict::from([(key.clone(), inner)])))
        }
        Some(Seg::Index(_)) => {
            let mut copy = below.cloned().ok_or_else(|| {
                format!(
                    "`{}` is not set by any spec file, so it has no items to change",
                    keypath::format(&segs[..depth])
                )
            })?;
            set(&mut copy, segs, depth, value)?;
            Ok(copy)
        }
    }
}

fn set(target: &mut Value, segs: &[Seg], depth: usize, value: Value) -> Result<(), String> {
    let here = || keypath::format(&segs[..depth]);
    match segs.get(depth) {
        None => *target = value,
        Some(Seg::Key(key)) => {
            let Value::Dict(_, dict) = target else {
                return Err(format!("`{}` is not a table", here()));
            };
            let child = dict.entry(key.clone()).or_insert_with(|| Value::Dict(Tag::Default, Dict::new()));
            set(child, segs, depth + 1, value)?;
        }
        Some(Seg::Index(i)) => {
            let Value::Array(_, items) = target else {
                return Err(format!("`{}` is not a list", here()));
            };
            let len = items.len();
            let item = items.get_mut(*i).ok_or_else(|| match len {
                0 => format!("`{}` is empty, so it has no item [{i}]", here()),
                1 => format!("`{}` has 1 item, so the only index is [0]", here()),
                n => format!("`{}` has {n} items, so [{i}] is past its end (use [0] to [{}])", here(), n - 1),
            })?;
            set(item, segs, depth + 1, value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Seg {
        Seg::Key(k.to_string())
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn homes() -> &'static BTreeMap<String, Vec<String>> {
        crate::spec::validate::homes()
    }

    #[test]
    fn maps_environment_names() {
        let found = from_env(
            &env(&[
                ("TRAINRUN_OPTIMIZER__LEARNING_RATE", "0.1"),
                ("trainrun_train__epochs", "3"),
                ("TRAINRUN_DATA_DIR", "/data"),
                ("TRAINRUN_TASK", "worker:0"),
                ("TRAINRUN_JOB_TOKEN", "secret"),
                ("PATH", "/bin"),
            ]),
            homes(),
        );
        assert_eq!(found.len(), 2);
        let Some(Ok(lr)) = found.first() else { panic!("the learning rate override parses: {found:?}") };
        assert_eq!(lr.segs, vec![key("optimizer"), key("learning_rate")]);
        assert_eq!(lr.value.to_f64(), Some(0.1));
        assert_eq!(lr.name, "environment variable TRAINRUN_OPTIMIZER__LEARNING_RATE");
        let Some(Ok(epochs)) = found.get(1) else { panic!("lower-case names are overrides too") };
        assert_eq!(epochs.segs, vec![key("train"), key("epochs")]);
        assert!(from_env(&env(&[("TRAINRUN_OPTIMIZER__", "1")]), homes())[0].is_err());
    }

    #[test]
    fn unknown_variables_get_a_did_you_mean() {
        let help = |name: &str| match from_env(&env(&[(name, "1")]), homes()).pop() {
            Some(Err(bad)) => bad.help,
            other => panic!("{name} should be refused: {other:?}"),
        };
        assert_eq!(help("TRAINRUN_DATADIR"), "did you mean `TRAINRUN_DATA_DIR`?");
        assert_eq!(help("trainrun_offline"), "did you mean `TRAINRUN_OFFLINE`?");
        assert!(help("TRAINRUN_LEARNING_RATE").starts_with("did you mean `TRAINRUN_OPTIMIZER__LEARNING_RATE`?"));
        assert!(
            help("TRAINRUN_OPTIMIZER_LEARNING_RATE").starts_with("did you mean `TRAINRUN_OPTIMIZER__LEARNING_RATE`?")
        );
        assert!(help("TRAINRUN_LERNING_RATE").starts_with("did you mean `TRAINRUN_OPTIMIZER__LEARNING_RATE`?"));
        assert!(help("TRAINRUN_STARTUP_TIMEOUT_S").starts_with("did you mean `TRAINRUN_CLUSTER__STARTUP_TIMEOUT_S`?"));
        assert!(help("TRAINRUN_XYZZY").contains("TRAINRUN_DATA_DIR"));
        let known =
            env(&[("TRAINRUN_SWEEP_TRIAL", "2"), ("TRAINRUN_COLLECTIVE_RANK", "1"), ("TRAINRUN_PROGRESS", "events")]);
        assert!(from_env(&known, homes()).is_empty());
    }

    #[test]
    fn parses_set_values_as_toml_else_strings() {
        let value = |text: &str| match from_set(text) {
            Ok(ov) => ov.value,
            Err(bad) => panic!("{text}: {bad:?}"),
        };
        assert_eq!(value("a.b=0.1").to_f64(), Some(0.1));
        assert_eq!(value("a.b=64").to_i128(), Some(64));
        assert_eq!(value("a.b=true").to_bool(), Some(true));
        assert_eq!(value("a.b=[1, 2]").as_array().map(|a| a.len()), Some(2));
        assert_eq!(value("a.b=\"x\"").as_str(), Some("x"));
        assert_eq!(value("run.name=foo").as_str(), Some("foo"));
        assert_eq!(value("data.dir=/data/mnist").as_str(), Some("/data/mnist"));
        assert_eq!(value("run.name=").as_str(), Some(""));
        let Ok(indexed) = from_set("model.layers[1].units=64") else { panic!("indexed keys parse") };
        assert_eq!(indexed.segs, vec![key("model"), key("layers"), Seg::Index(1), key("units")]);
    }

    #[test]
    fn rejects_malformed_sets() {
        for text in ["optimizer.learning_rate", "=0.1", " =1", "a..b=1", "a[x]=1", "extends=b.toml"] {
            let Err(bad) = from_set(text) else { panic!("{text} should be rejected") };
            assert_eq!(bad.name, format!("--set {text}"));
            assert!(bad.message.contains(text), "{}", bad.message);
        }
    }

    #[test]
    fn changes_one_item_of_an_array() {
        let item = |units: i64| Value::Dict(Tag::Default, Dict::from([("units".to_string(), Value::from(units))]));
        let layers = Value::Array(Tag::Default, vec![item(1), item(2)]);
        let model = Value::Dict(Tag::Default, Dict::from([("layers".to_string(), layers)]));
        let below = Value::Dict(Tag::Default, Dict::from([("model".to_string(), model)]));
        let Ok(ov) = from_set("model.layers[1].units=64") else { panic!("parses") };
        let Ok(data) = layer_data(&ov, &below) else { panic!("applies") };
        let data = Value::Dict(Tag::Default, data);
        assert_eq!(data.find_ref("model.layers").and_then(|v| v.as_array()).map(|a| a.len()), Some(2));
        let Some(Value::Array(_, items)) = data.find_ref("model.layers") else { panic!("an array") };
        assert_eq!(items[0].find_ref("units").and_then(Value::to_i128), Some(1));
        assert_eq!(items[1].find_ref("units").and_then(Value::to_i128), Some(64));
        let Ok(far) = from_set("model.layers[5].units=64") else { panic!("parses") };
        let Err(bad) = layer_data(&far, &below) else { panic!("index 5 is past the end") };
        assert!(bad.message.contains("has 2 items"), "{}", bad.message);
        let Ok(env) = from_env(&env(&[("TRAINRUN_MODEL__LAYERS__0__UNITS", "8")]), homes()).remove(0) else {
            panic!("parses")
        };
        let Ok(data) = layer_data(&env, &below) else { panic!("numeric keys index arrays") };
        let data = Value::Dict(Tag::Default, data);
        let Some(Value::Array(_, items)) = data.find_ref("model.layers") else { panic!("an array") };
        assert_eq!(items[0].find_ref("units").and_then(Value::to_i128), Some(8));
    }
}
