//! Tables in validation: their keys, unknown keys (with "did you mean"), missing keys, and
//! where each key of the spec lives for cross-section suggestions.

use super::{Tagged, Walker, table_name};
use crate::spec::keypath::{self, Seg};
use crate::spec::render::Finding;
use crate::spec::words::{branches, closest, description, example, resolve};
use figment::value::{Dict, Value};
use serde_json::Value as Json;
use std::collections::BTreeMap;

impl<'s> Walker<'s> {
    pub(super) fn check_table(
        &mut self,
        dict: &Dict,
        schema: &'s Json,
        tagged: Option<&Tagged<'s>>,
        path: &mut Vec<Seg>,
    ) {
        let properties = schema.get("properties").and_then(Json::as_object);
        let property = |key: &str| properties.and_then(|p| p.get(key));
        for (key, value) in dict {
            if tagged.is_some_and(|t| t.tag == key) {
                continue;
            }
            path.push(Seg::Key(key.clone()));
            match (property(key), schema.get("additionalProperties")) {
                (Some(property), _) => self.check(value, property, property, path),
                (None, Some(Json::Bool(false))) => self.unknown_key(key, value, properties, tagged, path),
                (None, Some(other @ Json::Object(_))) => self.check(value, other, other, path),
                (None, _) => {}
            }
            path.pop();
        }
        let required = schema.get("required").and_then(Json::as_array);
        for name in required.into_iter().flatten().filter_map(Json::as_str) {
            if !dict.contains_key(name) && tagged.is_none_or(|t| t.tag != name) {
                self.missing(name, property(name).unwrap_or(&Json::Null), tagged, path);
            }
        }
    }

    fn unknown_key(
        &mut self,
        key: &str,
        value: &Value,
        properties: Option<&serde_json::Map<String, Json>>,
        tagged: Option<&Tagged<'s>>,
        path: &[Seg],
    ) {
        let parent = path.split_last().map_or(path, |(_, parent)| parent);
        let section = parent.is_empty() && matches!(value, Value::Dict(..));
        let place = describe_table(parent, tagged);
        let message =
            if section { format!("unknown section `[{key}]`") } else { format!("unknown key `{key}` in {place}") };
        let known: Vec<&str> = properties.into_iter().flat_map(|p| p.keys().map(String::as_str)).collect();
        let home = keypath::format(parent);
        let elsewhere: Vec<&String> = self
            .homes
            .get(key)
            .map(|h| h.iter().filter(|s| **s != home && !s.is_empty()).collect())
            .unwrap_or_default();
        let other_variants: Vec<String> = tagged
            .map(|t| {
                t.branches
                    .iter()
                    .filter(|b| b.get("properties").and_then(|p| p.get(key)).is_some())
                    .filter_map(|b| b.pointer(&format!("/properties/{}/const", t.tag))?.as_str())
                    .map(|n| format!("`{n}`"))
                    .collect()
            })
            .unwrap_or_default();
        let listed = known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        let help = if let Some(c) = closest(key, known.iter().copied()) {
            if section { format!("did you mean `[{c}]`?") } else { format!("did you mean `{c}`?") }
        } else if let (Some(t), false) = (tagged, other_variants.is_empty()) {
            format!(
                "`{key}` belongs to {} {}s; a `{}` {} takes {listed}",
                other_variants.join(", "),
                t.what,
                t.name,
                t.what
            )
        } else if !elsewhere.is_empty() && elsewhere.len() <= 3 {
            let places: Vec<String> = elsewhere.iter().map(|s| format!("`{s}.{key}`")).collect();
            format!("did you mean {}?", places.join(" or "))
        } else {
            format!("{} takes {listed}", describe_table(parent, tagged))
        };
        self.findings.push(
            Finding::new(keypath::format(path), message)
                .at_key()
                .label(if section { "unknown section" } else { "unknown key" })
                .help(help),
        );
    }

    fn missing(&mut self, name: &str, property: &'s Json, tagged: Option<&Tagged<'s>>, path: &mut Vec<Seg>) {
        let place = describe_table(path, tagged);
        let (resolved, _) = resolve(self.root, property);
        let is_table = resolved.get("properties").is_some();
        path.push(Seg::Key(name.to_string()));
        let key = keypath::format(path);
        path.pop();
        let section = path.is_empty() && is_table;
        let message =
            if section { format!("missing section `[{name}]`") } else { format!("missing `{name}` in {place}") };
        let text = description(self.root, property);
        let summary =
            text.split_once("`: ").map_or(text, |(_, s)| s).trim_end_matches(" Required.").trim_end_matches('.');
        let inner_example = resolved
            .get("properties")
            .and_then(Json::as_object)
            .and_then(|p| p.values().filter_map(|v| example(description(self.root, v))).find(|ex| ex.contains(" = ")));
        let help = match (example(text), section) {
            (Some(ex), _) => format!("add {ex}"),
            (None, true) => match inner_example {
                Some(ex) => format!("add a `[{name}]` section ({summary}), e.g. {ex}"),
                None => format!("add a `[{name}]` section ({summary})"),
            },
            (None, false) => format!("add `{name}`: {summary}"),
        };
        self.findings.push(Finding::new(key, message).label(format!("missing `{name}`")).help(help));
    }
}

/// `[optimizer]`, `` `model.layers[1]`, a `dense` layer ``, or `the top level`.
fn describe_table(path: &[Seg], tagged: Option<&Tagged<'_>>) -> String {
    let name = table_name(path);
    match tagged {
        Some(t) => format!("{name}, a `{}` {}", t.name, t.what),
        None => name,
    }
}

/// Where each key is valid, by section path, for "did you mean `optimizer.learning_rate`?".
pub(super) fn homes(root: &Json) -> BTreeMap<String, Vec<String>> {
    fn walk(root: &Json, schema: &Json, prefix: &str, depth: usize, out: &mut BTreeMap<String, Vec<String>>) {
        let (schema, _) = resolve(root, schema);
        for keyword in ["oneOf", "anyOf"] {
            for branch in branches(schema, keyword).unwrap_or_default() {
                walk(root, branch, prefix, depth, out);
            }
        }
        let Some(properties) = schema.get("properties").and_then(Json::as_object) else {
            return;
        };
        for (key, property) in properties {
            let homes = out.entry(key.clone()).or_default();
            if !homes.iter().any(|h| h == prefix) {
                homes.push(prefix.to_string());
            }
            if depth < 3 {
                let child = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                walk(root, property, &child, depth + 1, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, "", 0, &mut out);
    out
}
