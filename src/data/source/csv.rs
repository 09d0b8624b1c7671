//! The `csv` source: a table with a header row, a label column chosen by name and numeric
//! feature columns. Class labels (text, or whole numbers) train a classifier, with the sorted
//! class names written to the run folder as `classes.json`; float labels are regression
//! targets (`mean_squared_error`, `mean_absolute_error`, `huber`).
//!
//! The tables are read here too ([`CsvDataset`]): every other column, or a listed set, in the
//! listed order, are the features. The `csv` crate splits records (quotes, escapes, CRLF);
//! cells are trimmed of surrounding whitespace and then parsed strictly: a feature cell must
//! be a finite number, and anything else is an error at `file:line:column` (the column being
//! the 1-based field number) naming the value.
//!
//! Labels: with [`CsvLabels::Classes`], whole numbers `0..n` are class indices as they are, and
//! any other values are class names, sorted, so the index of a name is its rank (the mapping is
//! [`Labels::classes`]). With [`CsvLabels::Regression`], every label must be a finite number.
//! Left unset, the kind is inferred: text labels are classes, whole numbers are classes, other
//! numbers are regression; a column mixing numbers with text is refused rather than guessed,
//! since that is usually one bad cell in a regression target.
//!
//! The whole table is parsed at open into `f32` (a CSV file is larger than its values).

use super::{DataSource, RawValues, missing_in, require};
use crate::data::error::{DataError, Position, UnknownName, columns_differ, quoted};
use crate::data::examples::{Examples, LabelKind, Split};
use crate::data::formats::{Classes, Dtype, Labels, RandomAccess, classes_from_names};
use crate::data::pipeline::Batch;
use crate::data::{DataFacts, DataWarning, Dataset};
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

/// `data.dataset = "csv"`: `[data.csv]`'s tables in `dir`.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvSource {
    pub dir: PathBuf,
    pub config: CsvConfig,
}

impl DataSource for CsvSource {
    fn name(&self) -> &'static str {
        "csv"
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn missing_files(&self) -> Vec<String> {
        missing_in(&self.dir, std::iter::once(&self.config.train).chain(&self.config.test))
    }

    /// Example counts, features and label kind (the tables are parsed).
    fn facts(&self) -> Result<DataFacts, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (dir, config) = (&self.dir, &self.config);
        let (train, test) = read(dir, config)?;
        let one_class = train.labels().single_class();
        let warning = |name| DataWarning::one_class("data.csv.label", &dir.join(&config.train), name);
        Ok(DataFacts {
            train_examples: train.len(),
            test_examples: test.as_ref().map_or(0, CsvDataset::len),
            example_shape: train.shape().to_vec(),
            labels: label_kind(&train).0,
            train_files: 1,
            warnings: one_class.map(warning).into_iter().collect(),
        })
    }

    /// Parses the tables.
    fn load(&self) -> Result<Dataset, DataError> {
        require(self.name(), &self.dir, self.missing_files())?;
        let (dir, config) = (&self.dir, &self.config);
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

    /// A table with the training table's feature columns (by name), the label column or not.
    fn read_input(&self, file: &Path) -> Result<Split, DataError> {
        let config = &self.config;
        let features = match &config.features {
            Some(names) => names.clone(),
            None => {
                let header = CsvDataset::header(&self.dir.join(&config.train), &config.label)?;
                header.into_iter().filter(|h| *h != config.label).collect()
            }
        };
        let values = CsvDataset::read_features(file, &features, &config.label, config.features.is_some())?;
        crate::data::Unlabeled::split(file, vec![features.len()], values)
    }

    fn raw_values(&self) -> RawValues {
        RawValues::Numbers
    }
}

/// One table as [`Examples`].
#[derive(Debug)]
pub(super) struct Table(pub CsvDataset);

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

fn options(config: &CsvConfig) -> CsvOptions {
    CsvOptions { label: config.label.clone(), features: config.features.clone(), label_kind: config.labels }
}

/// The label kind of the training table, and its classes.
pub(super) fn label_kind(table: &CsvDataset) -> (LabelKind, Option<Classes>) {
    match table.labels() {
        Labels::Classes { classes, .. } => (LabelKind::Class { classes: classes.len() }, Some(classes.clone())),
        Labels::Targets { width, .. } => (LabelKind::Target { width: *width }, None),
    }
}

/// Reads both tables. The test table is read as the training table was: its columns by
/// header name (a position would silently pair other columns), its labels of the same kind,
/// and its class names as the training table's indices.
fn read(dir: &Path, config: &CsvConfig) -> Result<(CsvDataset, Option<CsvDataset>), DataError> {
    let train_path = dir.join(&config.train);
    let train = CsvDataset::open(&train_path, &options(config))?;
    let Some(name) = &config.test else { return Ok((train, None)) };
    let test_path = dir.join(name);
    let mut options = options(config);
    if config.features.is_none() {
        let header = CsvDataset::header(&test_path, &config.label)?;
        let named = |n: &String| header.contains(n);
        let wanted = train.feature_names().iter().chain(std::iter::once(&config.label));
        let missing: Vec<String> = wanted.filter(|n| !named(n)).cloned().collect();
        let extra: Vec<String> =
            header.iter().filter(|h| **h != config.label && !train.feature_names().contains(h)).cloned().collect();
        if !missing.is_empty() || !extra.is_empty() {
            let difference = columns_differ(&missing, &extra);
            return Err(DataError::ColumnsDiffer { train: train_path, test: test_path, difference });
        }
        options.features = Some(train.feature_names().to_vec());
    }
    options.label_kind = Some(match train.labels() {
        Labels::Classes { .. } => CsvLabels::Classes,
        Labels::Targets { .. } => CsvLabels::Regression,
    });
    let mut test = CsvDataset::open(&test_path, &options)?;
    align_test_classes(&train, &mut test, &config.label, &train_path, &test_path)?;
    Ok((train, Some(test)))
}

/// Numbers the test table's class names as the training table's (`label` is the label
/// column or field); a name the training table lacks is an error naming them all.
pub(super) fn align_test_classes(
    train: &CsvDataset,
    test: &mut CsvDataset,
    label: &str,
    train_path: &Path,
    test_path: &Path,
) -> Result<(), DataError> {
    if let (Labels::Classes { classes, .. }, Labels::Classes { index, classes: names }) =
        (train.labels(), &mut test.labels)
    {
        // Numbered classes name every index up to the largest: only the labels used count.
        let used: std::collections::BTreeSet<u32> = index.iter().copied().collect();
        let name = |i: &u32| names.names()[*i as usize].clone();
        let unknown: Vec<String> = used.iter().map(name).filter(|n| classes.index_of(n).is_none()).collect();
        if !unknown.is_empty() {
            let labels = format!(
                "label column `{}` holds {} that the training table {} does not have (its classes: {})",
                label,
                quoted(&unknown),
                train_path.display(),
                classes.names().join(", ")
            );
            return Err(DataError::UnknownClasses { test: test_path.to_path_buf(), labels });
        }
        for i in index.iter_mut() {
            *i = classes.index_of(&names.names()[*i as usize]).unwrap_or(*i);
        }
        *names = classes.clone();
    }
    Ok(())
}

/// Which columns to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// The label column's header.
    pub label: String,
    /// Feature columns in this order; `None` reads every column but the label, in file order.
    pub features: Option<Vec<String>>,
    /// The label kind; `None` infers it from the values (see the module documentation).
    pub label_kind: Option<CsvLabels>,
}

impl CsvOptions {
    /// Every column but `label` is a feature; the label kind is inferred.
    pub fn label(label: &str) -> Self {
        Self { label: label.to_string(), features: None, label_kind: None }
    }
}

/// A parsed CSV table as a [`RandomAccess`] dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvDataset {
    features: Vec<f32>,
    shape: [usize; 1],
    feature_names: Vec<String>,
    labels: Labels,
}

/// A label cell and where it was, for the errors of label inference.
pub(super) struct LabelCell {
    pub value: String,
    pub line: u64,
}

impl CsvDataset {
    /// Parses the table at `path`.
    pub fn open(path: &Path, options: &CsvOptions) -> Result<Self, DataError> {
        let (mut reader, header) = Self::reader(path, &options.label)?;
        let column = |name: &str| {
            header.iter().position(|h| h == name).ok_or_else(|| {
                DataError::UnknownName(Box::new(UnknownName {
                    path: path.to_path_buf(),
                    at: Some(Position::Line { line: 1, column: 1 }),
                    what: "column",
                    name: name.to_string(),
                    available: header.clone(),
                }))
            })
        };
        let label_column = column(&options.label)?;
        let feature_columns: Vec<usize> = match &options.features {
            Some(names) => names.iter().map(|n| column(n)).collect::<Result<_, _>>()?,
            None => (0..header.len()).filter(|&c| c != label_column).collect(),
        };
        if feature_columns.contains(&label_column) {
            return Err(DataError::Malformed {
                path: path.to_path_buf(),
                at: Position::Line { line: 1, column: label_column + 1 },
                problem: format!("column `{}` is the label; it cannot also be a feature", options.label),
            });
        }
        let (features, cells) = Self::rows(path, &mut reader, &header, &feature_columns, Some(label_column))?;
        let at = |line| Position::Line { line, column: label_column + 1 };
        let labels = labels_of(&cells, options.label_kind).map_err(|(line, problem)| DataError::Malformed {
            path: path.to_path_buf(),
            at: at(line),
            problem: format!("label column `{}`: {problem}", options.label),
        })?;
        let feature_names = feature_columns.iter().map(|&c| header[c].clone()).collect();
        Ok(Self { features, shape: [feature_columns.len()], feature_names, labels })
    }

    /// The features of every row of `reader` (past `header`) in `feature_columns`, and the
    /// label cells of `label_column` when there is one; a table of no rows is an error.
    fn rows(
        path: &Path,
        reader: &mut ::csv::Reader<std::fs::File>,
        header: &[String],
        feature_columns: &[usize],
        label_column: Option<usize>,
    ) -> Result<(Vec<f32>, Vec<LabelCell>), DataError> {
        let csv_error = |source| DataError::Csv { path: path.to_path_buf(), source };
        let mut features = vec![];
        let mut cells = vec![];
        let mut rows = 0;
        let mut record = ::csv::StringRecord::new();
        while reader.read_record(&mut record).map_err(csv_error)? {
            let line = record.position().map_or(0, ::csv::Position::line);
            for &c in feature_columns {
                let cell = record.get(c).unwrap_or_default();
                let at = Position::Line { line, column: c + 1 };
                features.push(parse_number(cell).map_err(|problem| DataError::Malformed {
                    path: path.to_path_buf(),
                    at,
                    problem: format!("column `{}`: {problem}", header[c]),
                })?);
            }
            if let Some(l) = label_column {
                cells.push(LabelCell { value: record.get(l).unwrap_or_default().to_string(), line });
            }
            rows += 1;
        }
        if rows == 0 {
            return Err(DataError::Malformed {
                path: path.to_path_buf(),
                at: Position::Line { line: 2, column: 1 },
                problem: format!("the table has a header ({}) but no rows; add rows of values", header.join(",")),
            });
        }
        Ok((features, cells))
    }

    /// The columns `features` of every row of the table at `path`, whose label column
    /// `label` may be there or not (`predict --input`); any other column is refused, since
    /// a feature read by position would pair the wrong values, unless `only` says the
    /// features are a chosen set (`data.csv.features`).
    pub fn read_features(path: &Path, features: &[String], label: &str, only: bool) -> Result<Vec<f32>, DataError> {
        let (mut reader, header) = Self::reader(path, label)?;
        let missing: Vec<String> = features.iter().filter(|f| !header.contains(f)).cloned().collect();
        let extra: Vec<String> =
            header.iter().filter(|h| !only && *h != label && !features.contains(h)).cloned().collect();
        if !missing.is_empty() || !extra.is_empty() {
            return Err(DataError::Malformed {
                path: path.to_path_buf(),
                at: Position::Line { line: 1, column: 1 },
                problem: format!(
                    "its columns are not the model's features: {}; the features are read by name ({}), the label \
                     column `{label}` may be left out: fix the header, or list the columns to read in data.csv.features",
                    columns_differ(&missing, &extra),
                    quoted(features)
                ),
            });
        }
        let columns: Vec<usize> = features.iter().filter_map(|f| header.iter().position(|h| h == f)).collect();
        Self::rows(path, &mut reader, &header, &columns, None).map(|(values, _)| values)
    }

    /// A table of rows already read elsewhere (a JSONL file's objects): `features` row-major,
    /// `feature_names.len()` a row.
    pub(super) fn from_parts(features: Vec<f32>, feature_names: Vec<String>, labels: Labels) -> Self {
        Self { features, shape: [feature_names.len()], feature_names, labels }
    }

    /// The column names of the table at `path` (whose label column is `label`), from its
    /// header row.
    pub fn header(path: &Path, label: &str) -> Result<Vec<String>, DataError> {
        Self::reader(path, label).map(|(_, header)| header)
    }

    /// A reader past the header row, and the header; an empty file is an error that says
    /// what the first line must hold (with the label column `label`, when there is one).
    fn reader(path: &Path, label: &str) -> Result<(::csv::Reader<std::fs::File>, Vec<String>), DataError> {
        let csv_error = |source| DataError::Csv { path: path.to_path_buf(), source };
        let mut reader = ::csv::ReaderBuilder::new().trim(::csv::Trim::All).from_path(path).map_err(csv_error)?;
        let header: Vec<String> = reader.headers().map_err(csv_error)?.iter().map(str::to_string).collect();
        if header.iter().all(String::is_empty) {
            return Err(DataError::Malformed {
                path: path.to_path_buf(),
                at: Position::Line { line: 1, column: 1 },
                problem: format!(
                    "the file is empty; a CSV table starts with a header row naming its columns (the label column `{label}` among them), \
                     then one row of values per example"
                ),
            });
        }
        Ok((reader, header))
    }

    /// The features of row `i` (empty when out of range).
    pub fn row(&self, i: usize) -> &[f32] {
        let width = self.shape[0];
        self.features.get(i * width..(i + 1) * width).unwrap_or_default()
    }

    /// The feature columns, in the order values are read.
    pub fn feature_names(&self) -> &[String] {
        &self.feature_names
    }
}

impl RandomAccess for CsvDataset {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn labels(&self) -> &Labels {
        &self.labels
    }

    fn read_at(&self, i: usize, out: &mut [f32]) -> Result<(), DataError> {
        let width = self.shape[0];
        out.copy_from_slice(&self.features[i * width..(i + 1) * width]);
        Ok(())
    }
}

/// A finite number, or why the cell is not one.
pub(super) fn parse_number(cell: &str) -> Result<f32, String> {
    if cell.is_empty() {
        return Err("empty cell; every feature needs a value".into());
    }
    match cell.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        // Finite as a double but not as a float: the value is fine, only too large for f32.
        Ok(_) if cell.parse::<f64>().is_ok_and(f64::is_finite) => Err(format!(
            "{cell} is out of the range of a 32-bit float (about ±3.4e38), which trainrun reads values \
             as; rescale the column (for example to its logarithm or a smaller unit)"
        )),
        Ok(_) => Err(format!("{cell:?} is not a finite number")),
        Err(_) => Err(format!("{cell:?} is not a number")),
    }
}

/// The labels, or the line of the first bad cell and why.
pub(super) fn labels_of(cells: &[LabelCell], kind: Option<CsvLabels>) -> Result<Labels, (u64, String)> {
    let class_index = |c: &LabelCell| c.value.parse::<u32>().ok();
    let all_indices = cells.iter().all(|c| class_index(c).is_some());
    let kind = match kind {
        Some(kind) => kind,
        None => infer(cells)?,
    };
    match kind {
        CsvLabels::Classes if all_indices => {
            let index: Vec<u32> = cells.iter().filter_map(class_index).collect();
            let count = index.iter().max().map_or(0, |&m| m + 1);
            Ok(Labels::Classes { index, classes: Classes::numbered(count) })
        }
        CsvLabels::Classes => {
            let names: Vec<&str> = cells.iter().map(|c| c.value.as_str()).collect();
            let (index, classes) = classes_from_names(&names);
            Ok(Labels::Classes { index, classes })
        }
        CsvLabels::Regression => {
            let values =
                cells.iter().map(|c| parse_number(&c.value).map_err(|p| (c.line, p))).collect::<Result<_, _>>()?;
            Ok(Labels::Targets { values, width: 1 })
        }
    }
}

/// Text or whole numbers: classes; other numbers: regression; numbers mixed with text: an
/// error at the first cell of the minority kind.
fn infer(cells: &[LabelCell]) -> Result<CsvLabels, (u64, String)> {
    let number = |c: &&LabelCell| parse_number(&c.value).is_ok();
    let first_number = cells.iter().find(number);
    let first_text = cells.iter().find(|c| !number(c));
    match (first_number, first_text) {
        (Some(n), Some(t)) => Err((
            t.line,
            format!(
                "{:?} is text but the column also holds numbers ({:?} on line {}); fix the cell, or \
                 set the label kind to classes to read every value as a class name",
                t.value, n.value, n.line
            ),
        )),
        (_, Some(_)) | (None, None) => Ok(CsvLabels::Classes),
        (Some(_), None) if cells.iter().all(|c| c.value.parse::<u32>().is_ok()) => Ok(CsvLabels::Classes),
        (Some(_), None) => Ok(CsvLabels::Regression),
    }
}

#[cfg(test)]
mod tests;
