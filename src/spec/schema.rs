//! The JSON Schema of [`Spec`](super::Spec), generated from the serde types and their doc comments.
//!
//! Editors (taplo, Even Better TOML) validate spec files with the checked-in copy in
//! `schemas/trainrun.schema.json`; the loader validates with the same value, so the two never
//! disagree.

use super::Spec;
use std::sync::OnceLock;

/// The JSON Schema (draft 2020-12) of a spec, as a `serde_json` value, built once per process:
/// every spec load validates against it (a sweep loads one spec per trial, `check` and the
/// property tests thousands), and building it walks every spec type, a third of a load's time.
pub fn schema_value() -> &'static serde_json::Value {
    static SCHEMA: OnceLock<serde_json::Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let mut schema = schemars::schema_for!(Spec);
        if let Some(object) = schema.as_object_mut() {
            object.insert("title".into(), "trainrun spec".into());
        }
        schema.to_value()
    })
}

/// The JSON Schema of a spec, pretty-printed, as checked in at `schemas/trainrun.schema.json`.
pub fn schema_json() -> String {
    let mut text = serde_json::to_string_pretty(schema_value()).unwrap_or_default();
    text.push('\n');
    text
}
