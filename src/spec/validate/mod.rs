//! Strict validation of the merged spec against its JSON Schema, before serde sees it, so that
//! every problem is reported at once with its exact key path (serde stops at the first).
//!
//! Covers what `schemars` generates for the spec types: `$ref`/`$defs`, `oneOf` of constants
//! (unit enums), `oneOf` with a constant discriminator (internally tagged enums), `anyOf`
//! (untagged enums and `Option`s), `type`, `minimum`/`maximum`, `minItems`/`maxItems`,
//! `pattern`, `properties`/`additionalProperties`/`required`.

mod numbers;
mod rules;
mod tables;

use super::keypath::{self, Seg};
use super::render::Finding;
use super::words::{self, branches, closest, constants, description, example, found, noun, one_of, resolve, show};
use figment::value::Value;
use regex_lite::Regex;
use serde_json::Value as Json;
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

/// Every problem of `value` against the spec's JSON Schema.
pub(crate) fn validate(value: &Value) -> Vec<Finding> {
    let schema = super::schema_value();
    let mut walker = Walker { root: schema, findings: Vec::new(), homes: homes(), patterns: HashMap::new() };
    walker.check(value, schema, schema, &mut Vec::new());
    let mut findings = walker.findings;
    findings.extend(rules::check(value));
    findings
}

/// For each key, the sections of the spec where it is valid (`learning_rate` → `optimizer`), to
/// suggest where a misplaced key or environment variable belongs. Walked once per process, as
/// the schema is built once: a load asks twice (its environment variables, then validation).
pub(crate) fn homes() -> &'static BTreeMap<String, Vec<String>> {
    static HOMES: OnceLock<BTreeMap<String, Vec<String>>> = OnceLock::new();
    HOMES.get_or_init(|| tables::homes(super::schema_value()))
}

/// The variant an internally tagged table was matched to, for messages.
struct Tagged<'s> {
    /// The tag key: `type` or `kind`.
    tag: &'s str,
    /// The tag value: `dense`.
    name: String,
    /// What the enum is: `layer`, `strategy`.
    what: String,
    branches: Vec<&'s Json>,
}

struct Walker<'s> {
    root: &'s Json,
    findings: Vec<Finding>,
    /// For each key, the sections where it is valid: `learning_rate` → `optimizer`.
    homes: &'static BTreeMap<String, Vec<String>>,
    patterns: HashMap<String, Option<Regex>>,
}

impl<'s> Walker<'s> {
    /// Checks `value` at `path` against `schema`; `doc` is the nearest property schema, whose
    /// doc comment gives examples for the help.
    fn check(&mut self, value: &Value, schema: &'s Json, doc: &'s Json, path: &mut Vec<Seg>) {
        let (resolved, _) = resolve(self.root, schema);
        if let Some(alternatives) = branches(resolved, "oneOf") {
            if let Some(values) = constants(&alternatives) {
                return self.check_constant(value, &values, schema, doc, path);
            }
            if let Some(tag) = discriminator(self.root, &alternatives) {
                return self.check_tagged(value, alternatives, tag, schema, doc, path);
            }
            return self.check_alternatives(value, &alternatives, schema, doc, path);
        }
        if let Some(alternatives) = branches(resolved, "anyOf") {
            return match alternatives.as_slice() {
                [only] => self.check(value, only, doc, path),
                _ => self.check_alternatives(value, &alternatives, schema, doc, path),
            };
        }
        let types = words::types(resolved);
        if !types.is_empty() && !types.iter().any(|t| is_kind(value, t)) {
            return self.wrong_type(value, schema, doc, path, None);
        }
        match value {
            Value::Num(_, n) => self.check_range(value, n, resolved, doc, path),
            Value::String(_, s) => self.check_pattern(s, resolved, path),
            Value::Array(_, items) => {
                self.check_length(items.len(), resolved, doc, path);
                if let Some(item_schema) = resolved.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        path.push(Seg::Index(i));
                        self.check(item, item_schema, doc, path);
                        path.pop();
                    }
                }
            }
            Value::Dict(_, dict) => self.check_table(dict, resolved, None, path),
            _ => {}
        }
    }

    fn check_constant(&mut self, value: &Value, values: &[String], schema: &'s Json, doc: &'s Json, path: &[Seg]) {
        let Value::String(_, s) = value else {
            return self.wrong_type(value, schema, doc, path, None);
        };
        if values.contains(s) {
            return;
        }
        let key = keypath::format(path);
        let allowed = one_of(values);
        let help = match closest(s, values.iter().map(String::as_str)) {
            Some(c) => format!("did you mean {c:?}? (allowed: {allowed})"),
            None if values.len() > 2 => format!("use one of {allowed}"),
            None => format!("use {allowed}"),
        };
        self.findings.push(
            Finding::new(&key, format!("unknown value {s:?} for `{key}`"))
                .label(format!("expected {allowed}"))
                .help(help),
        );
    }

    /// Checks `value` against the internally tagged `branches` of `schema` (`tag` tells them
    /// apart), naming the enum after `schema`'s definition (`LayerSpec` → `layer`).
    fn check_tagged(
        &mut self,
        value: &Value,
        branches: Vec<&'s Json>,
        tag: &'s str,
        schema: &'s Json,
        doc: &'s Json,
        path: &mut Vec<Seg>,
    ) {
        let (_, def) = resolve(self.root, schema);
        let what = def
            .map(|d| d.trim_end_matches("Spec").trim_end_matches("Config").to_ascii_lowercase())
            .unwrap_or_else(|| "value".to_string());
        let names: Vec<String> = branches
            .iter()
            .filter_map(|b| b.pointer(&format!("/properties/{tag}/const"))?.as_str())
            .map(str::to_string)
            .collect();
        let Value::Dict(_, dict) = value else {
            let help = match value {
                Value::String(_, s) if names.contains(s) => {
                    Some(format!("write a table: `{} = {{ {tag} = {s:?} }}`", last_key(path)))
                }
                _ => None,
            };
            return self.wrong_type(value, schema, doc, path, help);
        };
        path.push(Seg::Key(tag.to_string()));
        let tag_key = keypath::format(path);
        path.pop();
        let listed = one_of(&names);
        let name = match dict.get(tag) {
            None => {
                let first = names.first().map_or("…", String::as_str);
                self.findings.push(
                    Finding::new(&tag_key, format!("{} has no `{tag}`", table_name(path)))
                        .label(format!("missing `{tag}`"))
                        .help(format!("add `{tag} = {first:?}` or another {what} {tag}: {listed}")),
                );
                return;
            }
            Some(Value::String(_, s)) if names.contains(s) => s.clone(),
            Some(Value::String(_, s)) => {
                let help = match closest(s, names.iter().map(String::as_str)) {
                    Some(c) => format!("did you mean {c:?}? The {what} {tag}s are {listed}"),
                    None => format!("the {what} {tag}s are {listed}"),
                };
                self.findings.push(
                    Finding::new(&tag_key, format!("unknown {what} {tag} {s:?} in {}", table_name(path)))
                        .label(format!("unknown {what} {tag}"))
                        .help(help),
                );
                return;
            }
            Some(other) => {
                self.findings.push(
                    Finding::new(&tag_key, format!("expected {listed} for `{tag_key}`, found {}", found(other)))
                        .label(format!("expected a {what} {tag}")),
                );
                return;
            }
        };
        let Some(branch) = branches
            .iter()
            .copied()
            .find(|b| b.pointer(&format!("/properties/{tag}/const")).and_then(Json::as_str) == Some(name.as_str()))
        else {
            return;
        };
        let tagged = Tagged { tag, name, what, branches };
        self.check_table(dict, branch, Some(&tagged), path);
    }

    fn check_alternatives(
        &mut self,
        value: &Value,
        alternatives: &[&'s Json],
        schema: &'s Json,
        doc: &'s Json,
        path: &mut Vec<Seg>,
    ) {
        let fitting: Vec<&'s Json> = alternatives.iter().copied().filter(|b| self.fits(value, b)).collect();
        match fitting.as_slice() {
            // One form has the value's type: its own, more precise, problems are the answer.
            [only] => self.check(value, only, doc, path),
            [] => {
                let mut help = None;
                for branch in alternatives {
                    let (branch, _) = resolve(self.root, branch);
                    if let Some(items) = branch.get("items")
                        && self.trial(value, items, doc, path).is_empty()
                    {
                        help = Some(format!("write a list: `{} = [{}]`", last_key(path), show(value)));
                    }
                }
                self.wrong_type(value, schema, doc, path, help);
            }
            [first, rest @ ..] => {
                let mut problems = self.trial(value, first, doc, path);
                if problems.is_empty() {
                    return;
                }
                for branch in rest {
                    if self.trial(value, branch, doc, path).is_empty() {
                        return;
                    }
                }
                self.findings.append(&mut problems);
            }
        }
    }

    /// The problems `value` would have against `schema`, without reporting them.
    fn trial(&mut self, value: &Value, schema: &'s Json, doc: &'s Json, path: &mut Vec<Seg>) -> Vec<Finding> {
        let outer = std::mem::take(&mut self.findings);
        self.check(value, schema, doc, path);
        std::mem::replace(&mut self.findings, outer)
    }

    /// Whether `value` has a type `schema` accepts at its top level.
    fn fits(&self, value: &Value, schema: &Json) -> bool {
        let (schema, _) = resolve(self.root, schema);
        if let Some(alts) = branches(schema, "oneOf").or_else(|| branches(schema, "anyOf")) {
            return alts.iter().any(|b| self.fits(value, b));
        }
        let types = words::types(schema);
        types.is_empty() || types.iter().any(|t| is_kind(value, t))
    }

    fn wrong_type(&mut self, value: &Value, schema: &'s Json, doc: &'s Json, path: &[Seg], help: Option<String>) {
        let key = keypath::format(path);
        let expected = noun(self.root, schema).one;
        let (resolved, _) = resolve(self.root, schema);
        let types = words::types(resolved);
        let wants = |t: &str| types.contains(&t);
        let number_text = |s: &str| s.trim().parse::<f64>().is_ok();
        let help = help.or_else(|| match value {
            Value::String(_, s)
                if (wants("integer") && s.trim().parse::<i64>().is_ok())
                    || (wants("number") && number_text(s))
                    || (wants("boolean") && (s == "true" || s == "false")) =>
            {
                Some(format!("remove the quotes: `{} = {}`", last_key(path), s.trim()))
            }
            Value::Num(_, n) if wants("integer") && words::is_float(n) => Some(match example_of(self.root, doc) {
                Some(ex) => format!("use a whole number, e.g. {ex}"),
                None => "use a whole number".to_string(),
            }),
            Value::Num(..) | Value::Bool(..) if wants("string") => {
                Some(format!("quote it: `{} = \"{}\"`", last_key(path), show(value)))
            }
            _ => example_of(self.root, doc).map(|ex| format!("e.g. {ex}")),
        });
        let mut finding = Finding::new(&key, format!("expected {expected} for `{key}`, found {}", found(value)))
            .label(format!("expected {expected}"));
        finding.diag.help = help;
        self.findings.push(finding);
    }

    fn check_pattern(&mut self, s: &str, schema: &'s Json, path: &[Seg]) {
        let Some(pattern) = schema.get("pattern").and_then(Json::as_str) else {
            return;
        };
        let regex = self.patterns.entry(pattern.to_string()).or_insert_with(|| Regex::new(pattern).ok());
        if regex.as_ref().is_none_or(|r| r.is_match(s)) {
            return;
        }
        let key = keypath::format(path);
        let what = noun(self.root, schema).one;
        // The form is what follows ": " in the description's first sentence ("A task address:
        // `host:port`."); later sentences (defaults, examples) say other things.
        let first = description(self.root, schema).split(". ").next().unwrap_or("");
        let form = first.split_once(": ").map_or("", |(_, form)| form.trim_end_matches('.'));
        let examples: Vec<String> = schema
            .get("examples")
            .and_then(Json::as_array)
            .map(|e| e.iter().filter_map(Json::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        let help = match (form.is_empty(), examples.is_empty()) {
            (false, false) => Some(format!("write {form}, e.g. {}", one_of(&examples))),
            (false, true) => Some(format!("write {form}")),
            (true, false) => Some(format!("e.g. {}", one_of(&examples))),
            (true, true) => None,
        };
        let mut finding = Finding::new(&key, format!("{s:?} is not {what} for `{key}`")).label(format!("not {what}"));
        finding.diag.help = help;
        self.findings.push(finding);
    }

    fn check_length(&mut self, len: usize, schema: &Json, doc: &Json, path: &[Seg]) {
        let min = schema.get("minItems").and_then(Json::as_u64).unwrap_or(0) as usize;
        let max = schema.get("maxItems").and_then(Json::as_u64).map(|m| m as usize);
        if len >= min && max.is_none_or(|m| len <= m) {
            return;
        }
        let items = |n: usize| {
            if n == 1 { "1 item".to_string() } else { format!("{n} items") }
        };
        let need = match max {
            Some(m) if m == min => format!("exactly {}", items(m)),
            Some(m) if min > 0 => format!("{min} to {}", items(m)),
            Some(m) => format!("at most {}", items(m)),
            None => format!("at least {}", items(min)),
        };
        let key = keypath::format(path);
        let mut finding =
            Finding::new(&key, format!("`{key}` must have {need}, found {len}")).label(format!("{len} items"));
        finding.diag.help = example_of(self.root, doc).map(|ex| format!("e.g. {ex}"));
        self.findings.push(finding);
    }
}

fn table_name(path: &[Seg]) -> String {
    if path.is_empty() {
        "the top level".to_string()
    } else if path.iter().any(|s| matches!(s, Seg::Index(_))) {
        format!("`{}`", keypath::format(path))
    } else {
        format!("[{}]", keypath::format(path))
    }
}

/// The key a value is written under, for `key = value` hints (`…` for list items).
fn last_key(path: &[Seg]) -> String {
    match path.iter().rev().find_map(|s| match s {
        Seg::Key(k) => Some(k),
        Seg::Index(_) => None,
    }) {
        Some(k) if matches!(path.last(), Some(Seg::Key(_))) => k.clone(),
        _ => keypath::format(path),
    }
}

fn example_of<'s>(root: &'s Json, doc: &'s Json) -> Option<&'s str> {
    example(description(root, doc))
}

fn is_kind(value: &Value, kind: &str) -> bool {
    match (kind, value) {
        ("integer", Value::Num(_, n)) => !words::is_float(n),
        ("number", Value::Num(..)) => true,
        ("string", Value::String(..) | Value::Char(..)) => true,
        ("boolean", Value::Bool(..)) => true,
        ("array", Value::Array(..)) => true,
        ("object", Value::Dict(..)) => true,
        ("null", Value::Empty(..)) => true,
        _ => false,
    }
}

/// The property every branch fixes with a `const`: the tag of an internally tagged enum.
fn discriminator<'s>(root: &Json, branches: &[&'s Json]) -> Option<&'s str> {
    let first = branches.first()?.get("properties")?.as_object()?;
    first.keys().map(String::as_str).find(|key| {
        branches.iter().all(|b| {
            let (b, _) = resolve(root, b);
            b.pointer(&format!("/properties/{key}/const")).is_some()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::files::table_to_dict;
    use figment::value::Tag;
    use toml::de::DeTable;

    /// The messages for a TOML document, keyed by path.
    fn problems(doc: &str) -> Vec<(String, String)> {
        let Ok(table) = DeTable::parse(doc) else { panic!("test TOML parses: {doc}") };
        let value = Value::Dict(Tag::Default, table_to_dict(table.get_ref()));
        validate(&value).into_iter().map(|f| (f.diag.key, f.diag.message)).collect()
    }

    #[test]
    fn accepts_a_valid_spec_and_integers_as_numbers() {
        let doc = "[model]\nzoo = \"resnet20\"\n[optimizer]\nlearning_rate = 1\n\
                   [strategy]\nkind = \"mirrored\"\ndevices = [\"gpu:0\", \"/GPU:1\"]\n\
                   [cluster]\nworker = [\"localhost:2222\", \"[::1]:2223\"]\n";
        assert_eq!(problems(doc), Vec::<(String, String)>::new());
    }

    #[test]
    fn reports_every_problem_with_its_path() {
        let doc = "[model]\nzoo = \"mnist_cnn\"\n[train]\nepochs = 1.0\nsteps_per_epoch = 0\n\
                   [[callbacks]]\nkind = \"early_stopping\"\npatience = -1\n\
                   [optimizer.scaling]\ntable = { \"64\" = \"fast\" }\n";
        let keys: Vec<String> = problems(doc).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            ["callbacks[0].patience", "optimizer.scaling.table.64", "train.epochs", "train.steps_per_epoch"]
        );
    }

    #[test]
    fn names_the_accepted_forms_of_untagged_enums() {
        let found = problems("[model]\nzoo = \"mnist_cnn\"\n[cluster]\nworker = true\n");
        assert_eq!(
            found,
            [(
                "cluster.worker".to_string(),
                "expected a positive integer or a list of `host:port` addresses for \
                 `cluster.worker`, found boolean true"
                    .to_string()
            )]
        );
    }

    #[test]
    fn missing_tag_and_missing_required_keys() {
        let found = problems("[[model.layers]]\nunits = 3\n[[model.layers]]\ntype = \"dropout\"\n");
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["model.layers[0].type", "model.layers[1].rate"]);
        let found = problems("[batch]\nglobal = 8\n");
        assert_eq!(found[0].1, "missing section `[model]`");
    }
}
