//! The words of validation messages: what a schema expects ("a positive integer or a list of
//! 2 positive integers"), what a value is (`string "64"`), examples taken from the doc
//! comments, and "did you mean" suggestions.

use figment::value::{Num, Value};
use serde_json::Value as Json;

/// A noun phrase for a schema, as one thing and as many (for lists).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Noun {
    pub one: String,
    pub many: String,
}

impl Noun {
    fn new(one: impl Into<String>, many: impl Into<String>) -> Self {
        Self { one: one.into(), many: many.into() }
    }
}

/// Follows `$ref`s into `root`'s `$defs`; also returns the name of the last definition.
pub(crate) fn resolve<'s>(root: &'s Json, mut schema: &'s Json) -> (&'s Json, Option<&'s str>) {
    let mut name = None;
    // Bounded: the spec's schema has no reference chains, but a bad one must not loop.
    for _ in 0..8 {
        let Some(reference) = schema.get("$ref").and_then(Json::as_str) else {
            break;
        };
        let Some(def) = reference.strip_prefix("#/$defs/") else {
            break;
        };
        match root.get("$defs").and_then(|d| d.get(def)) {
            Some(target) => {
                schema = target;
                name = Some(def);
            }
            None => break,
        }
    }
    (schema, name)
}

/// The branches of a `oneOf`/`anyOf`, without `{"type": "null"}` (TOML has no null: it
/// only marks `Option`s).
pub(crate) fn branches<'s>(schema: &'s Json, keyword: &str) -> Option<Vec<&'s Json>> {
    let all = schema.get(keyword)?.as_array()?;
    Some(all.iter().filter(|b| b.get("type").and_then(Json::as_str) != Some("null")).collect())
}

/// The `type`s a schema allows, without `null`.
pub(crate) fn types(schema: &Json) -> Vec<&str> {
    match schema.get("type") {
        Some(Json::String(t)) => vec![t.as_str()],
        Some(Json::Array(ts)) => ts.iter().filter_map(Json::as_str).filter(|t| *t != "null").collect(),
        _ => Vec::new(),
    }
}

/// The constant strings of a unit enum's `oneOf`, or `None` when a branch is not a constant.
pub(crate) fn constants(branches: &[&Json]) -> Option<Vec<String>> {
    branches.iter().map(|b| b.get("const").and_then(Json::as_str).map(str::to_string)).collect()
}

/// What a schema accepts, in words.
pub(crate) fn noun(root: &Json, schema: &Json) -> Noun {
    let (schema, _) = resolve(root, schema);
    let alternatives = branches(schema, "oneOf").or_else(|| branches(schema, "anyOf"));
    if let Some(alternatives) = alternatives {
        if let Some(values) = constants(&alternatives) {
            let listed = one_of(&values);
            return Noun::new(listed.clone(), listed);
        }
        let mut nouns: Vec<Noun> = Vec::new();
        for n in alternatives.iter().map(|b| noun(root, b)) {
            // The variants of a tagged enum are all tables: say so once.
            if !nouns.contains(&n) {
                nouns.push(n);
            }
        }
        let one: Vec<&str> = nouns.iter().map(|n| n.one.as_str()).collect();
        let many: Vec<&str> = nouns.iter().map(|n| n.many.as_str()).collect();
        return Noun::new(one.join(" or "), many.join(" or "));
    }
    let types = types(schema);
    let Some(first) = types.first() else {
        return Noun::new("a value", "values");
    };
    let minimum = schema.get("minimum").and_then(Json::as_f64);
    let positive = schema.get("exclusiveMinimum").and_then(Json::as_f64).is_some_and(|m| m >= 0.0);
    match *first {
        "integer" => match minimum {
            Some(m) if m >= 1.0 => Noun::new("a positive integer", "positive integers"),
            Some(m) if m >= 0.0 => Noun::new("a non-negative integer", "non-negative integers"),
            _ => Noun::new("an integer", "integers"),
        },
        "number" => match minimum {
            _ if positive => Noun::new("a positive number", "positive numbers"),
            Some(m) if m > 0.0 => Noun::new("a positive number", "positive numbers"),
            Some(m) if m >= 0.0 => Noun::new("a non-negative number", "non-negative numbers"),
            _ => Noun::new("a number", "numbers"),
        },
        "string" => match schema.get("title").and_then(Json::as_str) {
            Some(title) => Noun::new(format!("{} {title}", article(title)), plural(title)),
            None => Noun::new("a string", "strings"),
        },
        "boolean" => Noun::new("`true` or `false`", "booleans"),
        "array" => {
            let items = schema.get("items").map_or_else(|| Noun::new("a value", "values"), |i| noun(root, i));
            let min = schema.get("minItems").and_then(Json::as_u64);
            let max = schema.get("maxItems").and_then(Json::as_u64);
            match (min, max) {
                (Some(a), Some(b)) if a == b => {
                    Noun::new(format!("a list of {a} {}", items.many), format!("lists of {a} {}", items.many))
                }
                _ => Noun::new(format!("a list of {}", items.many), format!("lists of {}", items.many)),
            }
        }
        "object" => Noun::new("a table", "tables"),
        _ => Noun::new("a value", "values"),
    }
}

fn article(word: &str) -> &'static str {
    let first = word.trim_start_matches('`').chars().next().unwrap_or('x');
    if "aeiouAEIOU".contains(first) { "an" } else { "a" }
}

fn plural(word: &str) -> String {
    if word.ends_with('s') { format!("{word}es") } else { format!("{word}s") }
}

/// `"a", "b" or "c"`.
pub(crate) fn one_of(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    match quoted.split_last() {
        None => "nothing".to_string(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// The kind of a value and the value, as in `found string "64"`.
pub(crate) fn found(value: &Value) -> String {
    match value {
        Value::String(_, s) => format!("string {s:?}"),
        Value::Char(_, c) => format!("string \"{c}\""),
        Value::Bool(_, b) => format!("boolean {b}"),
        Value::Num(_, n) if is_float(n) => format!("float {}", show(value)),
        Value::Num(..) => format!("integer {}", show(value)),
        Value::Empty(..) => "nothing".to_string(),
        Value::Dict(..) => "a table".to_string(),
        Value::Array(_, items) => match items.len() {
            0 => "an empty list".to_string(),
            1 => "a list of 1 item".to_string(),
            n => format!("a list of {n} items"),
        },
    }
}

/// A value as written in TOML, for messages: `64`, `0.5`, `nan`, `-inf`, `"x"`.
pub(crate) fn show(value: &Value) -> String {
    match value {
        Value::Num(_, n) if is_float(n) => show_float(n.to_f64().unwrap_or(f64::NAN)),
        Value::Num(_, n) => match (n.to_i128(), n.to_u128()) {
            (Some(i), _) => i.to_string(),
            (None, Some(u)) => u.to_string(),
            (None, None) => "a number".to_string(),
        },
        Value::String(_, s) => format!("{s:?}"),
        Value::Bool(_, b) => b.to_string(),
        Value::Char(_, c) => format!("\"{c}\""),
        Value::Empty(..) => "nothing".to_string(),
        Value::Dict(..) => "{ … }".to_string(),
        Value::Array(..) => "[ … ]".to_string(),
    }
}

/// A float as TOML writes it: `0.5`, `1e20`, `nan`, `inf`, `-inf`.
pub(crate) fn show_float(x: f64) -> String {
    match x {
        x if x.is_nan() => "nan".to_string(),
        f64::INFINITY => "inf".to_string(),
        f64::NEG_INFINITY => "-inf".to_string(),
        x => format!("{x:?}"),
    }
}

/// Any number as `f64` (figment's `to_f64` only converts floats, `to_i128` only signed
/// integers).
pub(crate) fn number(n: &Num) -> Option<f64> {
    n.to_f64().or_else(|| integer(n).map(|i| i as f64))
}

/// An integer exactly; unsigned values beyond `i128::MAX` saturate (they exceed every bound).
pub(crate) fn integer(n: &Num) -> Option<i128> {
    n.to_i128().or_else(|| n.to_u128().map(|u| i128::try_from(u).unwrap_or(i128::MAX)))
}

pub(crate) fn is_float(n: &Num) -> bool {
    matches!(n, Num::F32(_) | Num::F64(_))
}

/// A bound from the schema, written as a user would: `0`, `1`, `0.999`.
pub(crate) fn bound(x: f64) -> String {
    format!("{x}")
}

/// The first `Example: `…`` of a doc comment, e.g. `` `units = 128` ``.
pub(crate) fn example(description: &str) -> Option<&str> {
    let start = description.find("Example: `")? + "Example: ".len();
    let rest = &description[start + 1..];
    let end = rest.find('`')?;
    Some(&description[start..start + end + 2])
}

/// The doc comment of a property (its own, else the referenced definition's).
pub(crate) fn description<'s>(root: &'s Json, schema: &'s Json) -> &'s str {
    schema
        .get("description")
        .and_then(Json::as_str)
        .or_else(|| resolve(root, schema).0.get("description").and_then(Json::as_str))
        .unwrap_or("")
}

/// The closest of `candidates` to `word`, when it is close enough to be a likely typo.
pub(crate) fn closest<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&word, &c.to_ascii_lowercase()), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn suggests_close_words_only() {
        let keys = ["kind", "learning_rate", "momentum"];
        assert_eq!(closest("lerning_rate", keys), Some("learning_rate"));
        assert_eq!(closest("learningrate", keys), Some("learning_rate"));
        assert_eq!(closest("Momentum", keys), Some("momentum"));
        assert_eq!(closest("batch_size", keys), None);
        assert_eq!(closest("conv3d", ["dense", "conv2d", "flatten"]), Some("conv2d"));
        assert_eq!(closest("full", ["valid", "same"]), None);
        assert_eq!(closest("optimiser", ["optimizer", "model"]), Some("optimizer"));
    }

    #[test]
    fn describes_schemas() {
        let root = json!({"$defs": {"Size2": {"anyOf": [
            {"type": "integer", "minimum": 1},
            {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2, "maxItems": 2}
        ]}}});
        let size = json!({"$ref": "#/$defs/Size2"});
        assert_eq!(noun(&root, &size).one, "a positive integer or a list of 2 positive integers");
        let tasks = json!({"anyOf": [
            {"type": "integer", "minimum": 1},
            {"type": "array", "items": {"type": "string", "title": "`host:port` address"}}
        ]});
        assert_eq!(noun(&root, &tasks).one, "a positive integer or a list of `host:port` addresses");
        let unit = json!({"oneOf": [{"const": "valid"}, {"const": "same"}]});
        assert_eq!(noun(&root, &unit).one, "\"valid\" or \"same\"");
    }

    #[test]
    fn words_values_and_examples() {
        assert_eq!(found(&Value::from("64")), "string \"64\"");
        assert_eq!(found(&Value::from(2.5)), "float 2.5");
        assert_eq!(found(&Value::from(3)), "integer 3");
        assert_eq!(found(&Value::from(f64::NAN)), "float nan");
        assert_eq!(show(&Value::from(f64::NEG_INFINITY)), "-inf");
        assert_eq!(show(&Value::from(u128::MAX)), u128::MAX.to_string());
        assert_eq!(show(&Value::from(1e20)), "1e20");
        assert_eq!(bound(0.0), "0");
        assert_eq!(bound(0.999), "0.999");
        assert_eq!(example("Output features. Example: `units = 128`."), Some("`units = 128`"));
        assert_eq!(example("No example."), None);
    }
}
