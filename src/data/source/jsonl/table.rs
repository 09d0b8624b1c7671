//! A JSONL table: each object's feature fields (numbers, or arrays of numbers flattened in
//! order) and its label field, into the `csv` source's table, so labels are read, inferred and
//! numbered exactly as a CSV column's.

use super::JsonlTable;
use super::lines::{Lines, ObjectLine, kind_of};
use crate::data::CsvLabels;
use crate::data::error::{DataError, Position, UnknownName};
use crate::data::formats::{Labels, RandomAccess as _};
use crate::data::source::csv::{CsvDataset, LabelCell, align_test_classes, labels_of};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Reads the training files into one table and the validation files into another, with the
/// training table's features, label kind and class numbering.
pub fn read(
    train: &[PathBuf],
    validation: &[PathBuf],
    config: &JsonlTable,
) -> Result<(CsvDataset, Option<CsvDataset>), DataError> {
    let train_table = TableRows::read(train, config, config.features.as_deref(), config.labels)?;
    let fields = train_table.fields.clone();
    let first = &train[0];
    let train_dataset = train_table.dataset(first, config)?;
    if validation.is_empty() {
        return Ok((train_dataset, None));
    }
    let kind = match train_dataset.labels() {
        Labels::Classes { .. } => CsvLabels::Classes,
        Labels::Targets { .. } => CsvLabels::Regression,
    };
    let names = fields.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
    let test = TableRows::read(validation, config, Some(&names), Some(kind))?;
    // An array field must hold as many values in every file.
    test.same_widths_as(&fields)?;
    let mut test_dataset = test.dataset(&validation[0], config)?;
    align_test_classes(&train_dataset, &mut test_dataset, &config.label, first, &validation[0])?;
    Ok((train_dataset, Some(test_dataset)))
}

/// The features of `file`, given to `predict --input`, and one example's shape: the fields the
/// training table reads (`config.features`, else every field but the label of the first
/// training object, sorted), each as wide as there; the label field may be left out.
pub fn read_input(train: &[PathBuf], config: &JsonlTable, file: &Path) -> Result<(Vec<usize>, Vec<f32>), DataError> {
    let mut reference = TableRows::new(None);
    let mut names = config.features.clone();
    if let Some(first) = train.first()
        && let Some(line) = Lines::open(first)?.next_object()?
    {
        let names = names.get_or_insert_with(|| feature_names(&line, config));
        reference.push_features(first, &line, names)?;
    }
    let names = names.unwrap_or_default();
    let mut rows = TableRows::new(None);
    let mut lines = Lines::open(file)?;
    while let Some(line) = lines.next_object()? {
        rows.push_features(file, &line, &names)?;
    }
    rows.same_widths_as(&reference.fields)?;
    Ok((vec![reference.features.len()], rows.features))
}

/// The feature fields of a table that names none: every field of `line` but the label, sorted.
fn feature_names(line: &ObjectLine, config: &JsonlTable) -> Vec<String> {
    let mut all: Vec<String> = line.object.keys().filter(|k| **k != config.label).cloned().collect();
    all.sort();
    all
}

/// A feature field and the number of values it holds (1 for a number).
#[derive(Debug, Clone)]
struct Field {
    name: String,
    width: usize,
    /// Where its width was first seen, for the error of a row that differs.
    path: PathBuf,
    line: u64,
}

/// The rows of one split as read, before the labels are made.
struct TableRows {
    fields: Vec<Field>,
    features: Vec<f32>,
    cells: Vec<LabelCell>,
    /// The path, line and byte of every row, to place a label error.
    places: Vec<(PathBuf, u64, u64)>,
    kind: Option<CsvLabels>,
}

impl TableRows {
    fn new(kind: Option<CsvLabels>) -> Self {
        TableRows { fields: vec![], features: vec![], cells: vec![], places: vec![], kind }
    }

    /// Reads every object of `paths`; `features` names the fields (all but the label of the
    /// first object, sorted, when `None`).
    fn read(
        paths: &[PathBuf],
        config: &JsonlTable,
        features: Option<&[String]>,
        kind: Option<CsvLabels>,
    ) -> Result<Self, DataError> {
        let mut rows = TableRows::new(kind);
        let mut names: Option<Vec<String>> = features.map(<[String]>::to_vec);
        for path in paths {
            let mut lines = Lines::open(path)?;
            while let Some(line) = lines.next_object()? {
                let names = names.get_or_insert_with(|| feature_names(&line, config));
                rows.push(path, &line, names, &config.label)?;
            }
        }
        if rows.cells.is_empty() {
            let path = paths.first().cloned().unwrap_or_default();
            return Err(DataError::Malformed {
                path,
                at: Position::File,
                problem: "no JSON objects; a JSONL table needs one object a line, each with the feature and label \
                          fields"
                    .into(),
            });
        }
        Ok(rows)
    }

    /// Appends one object's features and label.
    fn push(&mut self, path: &Path, line: &ObjectLine, names: &[String], label: &str) -> Result<(), DataError> {
        self.push_features(path, line, names)?;
        let value = match line.object.get(label) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(other) => return Err(wrong_field(path, line, label, kind_of(other), "a string or a number")),
            None => return Err(missing_field(path, line, label)),
        };
        // The 1-based row across the split's files: a label error maps it back to its place.
        self.cells.push(LabelCell { value, line: self.places.len() as u64 + 1 });
        self.places.push((path.to_path_buf(), line.line, line.byte));
        Ok(())
    }

    /// Appends one object's features, fields `names` in order.
    fn push_features(&mut self, path: &Path, line: &ObjectLine, names: &[String]) -> Result<(), DataError> {
        for (i, name) in names.iter().enumerate() {
            let value = line.object.get(name).ok_or_else(|| missing_field(path, line, name))?;
            let before = self.features.len();
            match value {
                Value::Number(n) => self.features.push(number(path, line, name, n)?),
                Value::Array(items) => {
                    for item in items {
                        match item {
                            Value::Number(n) => self.features.push(number(path, line, name, n)?),
                            other => {
                                let found = format!("an array holding {}", kind_of(other));
                                return Err(wrong_field(path, line, name, &found, "numbers"));
                            }
                        }
                    }
                }
                other => return Err(wrong_field(path, line, name, kind_of(other), "a number or an array of numbers")),
            }
            let width = self.features.len() - before;
            match self.fields.get(i) {
                None => {
                    self.fields.push(Field { name: name.clone(), width, path: path.to_path_buf(), line: line.line })
                }
                Some(field) if field.width == width => {}
                Some(field) => return Err(width_differs(path, line, field, width)),
            }
        }
        Ok(())
    }

    /// An error when an array field holds another number of values than in `train`.
    fn same_widths_as(&self, train: &[Field]) -> Result<(), DataError> {
        for (mine, theirs) in self.fields.iter().zip(train) {
            if mine.width != theirs.width {
                return Err(DataError::Malformed {
                    path: mine.path.clone(),
                    at: Position::Line { line: mine.line, column: 1 },
                    problem: format!(
                        "field `{}` holds {} values, but {} in the training file {} (line {})",
                        mine.name,
                        mine.width,
                        theirs.width,
                        theirs.path.display(),
                        theirs.line
                    ),
                });
            }
        }
        Ok(())
    }

    /// The table, with labels made from the cells (`first` is the split's first file).
    fn dataset(self, first: &Path, config: &JsonlTable) -> Result<CsvDataset, DataError> {
        // `LabelCell::line` holds the 1-based row here, so the error lands on its file and line.
        let labels = labels_of(&self.cells, self.kind).map_err(|(row, problem)| {
            let place = self.places.get(row.saturating_sub(1) as usize).cloned();
            let (path, line, byte) = place.unwrap_or((first.to_path_buf(), 0, 0));
            DataError::Malformed {
                path,
                at: Position::LineByte { line, column: 1, byte },
                problem: format!("label field `{}`: {}", config.label, problem.replace(" on line ", " on row ")),
            }
        })?;
        let names = self
            .fields
            .iter()
            .flat_map(|f| match f.width {
                1 => vec![f.name.clone()],
                n => (0..n).map(|i| format!("{}[{i}]", f.name)).collect(),
            })
            .collect();
        Ok(CsvDataset::from_parts(self.features, names, labels))
    }
}

/// A JSON number as a finite `f32`, or the error naming the field.
fn number(path: &Path, line: &ObjectLine, name: &str, n: &serde_json::Number) -> Result<f32, DataError> {
    let value = n.as_f64().unwrap_or(f64::NAN);
    let single = value as f32;
    if single.is_finite() {
        return Ok(single);
    }
    Err(DataError::Malformed {
        path: path.to_path_buf(),
        at: Position::LineByte { line: line.line, column: 1, byte: line.byte },
        problem: format!(
            "field `{name}`: {n} is out of the range of a 32-bit float (about ±3.4e38), which trainrun reads \
             values as; rescale the field"
        ),
    })
}

/// The error of an object without the field `name`, naming the fields it has.
pub fn missing_field(path: &Path, line: &ObjectLine, name: &str) -> DataError {
    DataError::UnknownName(Box::new(UnknownName {
        path: path.to_path_buf(),
        at: Some(Position::LineByte { line: line.line, column: 1, byte: line.byte }),
        what: "field",
        name: name.to_string(),
        available: line.object.keys().cloned().collect(),
    }))
}

/// The error of a field holding `found` where `expected` was needed.
pub fn wrong_field(path: &Path, line: &ObjectLine, name: &str, found: &str, expected: &str) -> DataError {
    DataError::Malformed {
        path: path.to_path_buf(),
        at: Position::LineByte { line: line.line, column: 1, byte: line.byte },
        problem: format!("field `{name}` holds {found}; expected {expected}"),
    }
}

fn width_differs(path: &Path, line: &ObjectLine, field: &Field, width: usize) -> DataError {
    DataError::Malformed {
        path: path.to_path_buf(),
        at: Position::LineByte { line: line.line, column: 1, byte: line.byte },
        problem: format!(
            "field `{}` holds {width} values, but {} in {} on line {}; every row needs as many",
            field.name,
            field.width,
            field.path.display(),
            field.line
        ),
    }
}
