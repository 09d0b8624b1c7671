//! A Hugging Face `datasets` `ClassLabel` column's names, from the JSON `datasets` keeps in the
//! Arrow schema's `huggingface` metadata (an Arrow IPC file of `save_to_disk`, a Parquet file of
//! `to_parquet`, whose footer carries the Arrow schema): `{"info": {"features": {"label":
//! {"_type": "ClassLabel", "names": [...]}}}}`. Class `i` is `names[i]`, so the run's class
//! names (`classes.json`, predict's output) are the dataset's own, in its order.

use arrow_schema::Schema;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The metadata key `datasets` writes its features under.
const KEY: &str = "huggingface";

#[derive(Deserialize)]
struct Metadata {
    info: Info,
}

#[derive(Deserialize)]
struct Info {
    #[serde(default)]
    features: BTreeMap<String, serde_json::Value>,
}

/// The names of column `column`'s classes when `schema`'s metadata describes it as a
/// `ClassLabel`; `None` for any other column, or metadata `datasets` did not write (a column
/// whose names cannot be read is read as plain integers, as before `datasets` named them).
pub(super) fn names(schema: &Schema, column: &str) -> Option<Vec<String>> {
    from_json(schema.metadata().get(KEY)?, column)
}

/// [`names`] from the JSON of the `huggingface` metadata.
fn from_json(json: &str, column: &str) -> Option<Vec<String>> {
    let Metadata { info } = serde_json::from_str(json).ok()?;
    let feature = info.features.get(column)?;
    if feature.get("_type")?.as_str()? != "ClassLabel" {
        return None;
    }
    let names = feature.get("names")?.as_array()?;
    names.iter().map(|n| n.as_str().map(str::to_owned)).collect()
}

#[cfg(test)]
mod tests {
    use super::from_json as names;

    #[test]
    fn a_class_label_column_has_its_names_in_the_datasets_order() {
        let json = r#"{"info": {"features": {"x": {"dtype": "float32", "_type": "Value"},
            "kind": {"names": ["zeta", "alpha", "mid"], "_type": "ClassLabel"}}}}"#;
        assert_eq!(names(json, "kind"), Some(vec!["zeta".into(), "alpha".into(), "mid".into()]));
        assert_eq!(names(json, "x"), None);
        assert_eq!(names(json, "absent"), None);
        assert_eq!(names("{}", "kind"), None);
        assert_eq!(names("not json", "kind"), None);
    }
}
