//! The `csv` source: a table with a header row, a label column chosen by name and numeric
//! feature columns, read by [`formats::csv`](super::formats::csv) (the `csv` crate, strict
//! number parsing, errors at `file:line:column`). Class labels (text, or whole numbers) train a
//! classifier, with the sorted class names written to the run folder as `classes.json`; float
//! labels are regression targets (`mean_squared_error`, `mean_absolute_error`, `huber`).

use super::error::DataError;
use super::examples::{Examples, LabelKind, Split};
use super::formats::csv::{CsvDataset, CsvOptions, LabelKind as CsvLabelKind};
use super::formats::{Classes, Labels, RandomAccess};
use super::pipeline::Batch;
use super::{DataFacts, Dataset};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[data.csv]`: a CSV table with a header row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CsvConfig {
    /// The training table, relative to `data.dir` (or absolute). Required.
    /// Example: `train = "train.csv"`.
    pub train: String,
    /// The test table, with the same columns (and, for classes, the same class names).
    /// Default: none (nothing is evaluated). Example: `test = "test.csv"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<String>,
    /// The label column's header. Required. Example: `label = "species"`.
    pub label: String,
    /// Feature columns, in this order. Default: every column but the label, in file order.
    /// Example: `features = ["sepal_length", "sepal_width"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    /// What the label column holds. Default: inferred (text or whole numbers are classes,
    /// other numbers regression targets). Example: `labels = "regression"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<CsvLabels>,
}

/// `data.csv.labels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CsvLabels {
    /// Class names or indices.
    Classes,
    /// One float target per row.
    Regression,
}

/// One table as [`Examples`].
#[derive(Debug)]
struct Table(CsvDataset);

impl Examples for Table {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn shape(&self) -> &[usize] {
        self.0.shape()
    }

    fn append(&self, i: usize, batch: &mut Batch) -> Result<(), DataError> {
        batch.x.extend_from_slice(self.0.row(i));
        match self.0.labels() {
            Labels::Classes { index, .. } => batch.y.push(index.get(i).copied().unwrap_or(0)),
            Labels::Targets { .. } => batch.targets.extend_from_slice(self.0.labels().targets(i).unwrap_or_default()),
        }
        Ok(())
    }

    fn bytes_held(&self) -> usize {
        self.0.len() * (self.0.example_len() + 1) * 4
    }
}

fn open(dir: &Path, name: &str, config: &CsvConfig) -> Result<(PathBuf, CsvDataset), DataError> {
    let options = CsvOptions {
        label: config.label.clone(),
        features: config.features.clone(),
        label_kind: config.labels.map(|l| match l {
            CsvLabels::Classes => CsvLabelKind::Classes,
            CsvLabels::Regression => CsvLabelKind::Regression,
        }),
    };
    let path = dir.join(name);
    CsvDataset::open(&path, &options).map(|t| (path, t))
}

/// The label kind of the training table, and its classes.
fn label_kind(table: &CsvDataset) -> (LabelKind, Option<Classes>) {
    match table.labels() {
        Labels::Classes { classes, .. } => (LabelKind::Class { classes: classes.len() }, Some(classes.clone())),
        Labels::Targets { width, .. } => (LabelKind::Target { width: *width }, None),
    }
}

/// Reads both tables and checks that they agree.
fn read(dir: &Path, config: &CsvConfig) -> Result<(CsvDataset, Option<CsvDataset>), DataError> {
    let (train_path, train) = open(dir, &config.train, config)?;
    let test = match &config.test {
        None => None,
        Some(name) => {
            let (test_path, test) = open(dir, name, config)?;
            let (a, b) = (label_kind(&train), label_kind(&test));
            // Class indices come from sorted names per file: the files must name the same classes.
            if a.1 != b.1 || std::mem::discriminant(&a.0) != std::mem::discriminant(&b.0) {
                let names =
                    |c: &Option<Classes>| c.as_ref().map_or("float targets".to_string(), |c| c.names().join(", "));
                return Err(DataError::ClassesDiffer {
                    first: train_path,
                    second: test_path,
                    difference: format!("the training labels are {}, the test labels {}", names(&a.1), names(&b.1)),
                });
            }
            Some(test)
        }
    };
    Ok((train, test))
}

/// Example counts, features and label kind (the tables are parsed).
pub fn facts(dir: &Path, config: &CsvConfig) -> Result<DataFacts, DataError> {
    let (train, test) = read(dir, config)?;
    Ok(DataFacts {
        train_examples: train.len(),
        test_examples: test.as_ref().map_or(0, CsvDataset::len),
        example_shape: train.shape().to_vec(),
        labels: label_kind(&train).0,
        train_files: 1,
    })
}

/// Parses the tables.
pub fn load(dir: &Path, config: &CsvConfig) -> Result<Dataset, DataError> {
    let (train, test) = read(dir, config)?;
    let (labels, classes) = label_kind(&train);
    Ok(Dataset {
        train: Split::of(Table(train)),
        test: test.map(|t| Split::of(Table(t))),
        labels,
        vocabulary: None,
        classes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(test: Option<&str>) -> CsvConfig {
        CsvConfig {
            train: "a.csv".into(),
            test: test.map(String::from),
            label: "y".into(),
            features: None,
            labels: None,
        }
    }

    #[test]
    fn float_labels_are_targets_and_names_are_sorted_classes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.csv"), "x1,y,x2\n1,0.5,2\n3,1.5,4\n").unwrap();
        let data = load(dir.path(), &config(None)).unwrap();
        assert_eq!(data.labels, LabelKind::Target { width: 1 });
        let b = data.train.read(0..2).unwrap();
        assert_eq!((b.x, b.y, b.targets), (vec![1., 2., 3., 4.], vec![], vec![0.5, 1.5]));

        std::fs::write(dir.path().join("a.csv"), "x1,y\n1,dog\n3,cat\n").unwrap();
        std::fs::write(dir.path().join("b.csv"), "x1,y\n1,cat\n3,dog\n").unwrap();
        let data = load(dir.path(), &config(Some("b.csv"))).unwrap();
        assert_eq!(data.labels, LabelKind::Class { classes: 2 });
        assert_eq!(data.classes.as_ref().map(Classes::names), Some(&["cat".to_string(), "dog".into()][..]));
        assert_eq!(data.train.read(0..2).unwrap().y, [1, 0]);
        assert_eq!(facts(dir.path(), &config(Some("b.csv"))).unwrap(), data.facts(1));

        std::fs::write(dir.path().join("b.csv"), "x1,y\n1,cat\n3,bird\n").unwrap();
        let err = load(dir.path(), &config(Some("b.csv"))).unwrap_err().to_string();
        assert!(err.contains("the training labels are cat, dog, the test labels bird, cat"), "{err}");
    }
}
