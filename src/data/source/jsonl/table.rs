//! A JSONL table: each object's feature fields (numbers, or arrays of numbers flattened in
//! order) and its label field, read as the `csv` source reads its columns, so labels are
//! inferred and numbered exactly as a CSV column's.
//!
//! The table is never held: a pass over each split's files at load ([`scan`]) checks every
//! object and keeps only what a row does not tell alone (objects per file, the fields' widths,
//! the label kind and the class names); the rows are then read as a stream (`stream`), each
//! decoded with the [`FeatureReader`] and [`Labeler`] the pass made.

use super::JsonlTable;
use super::lines::{Lines, ObjectLine, kind_of};
use crate::data::CsvLabels;
use crate::data::error::{DataError, Position, UnknownName};
use crate::data::examples::LabelKind;
use crate::data::formats::{Classes, Labels, RandomAccess as _};
use crate::data::source::columnar::split::RowLabel;
use crate::data::source::csv::{CsvDataset, LabelCell, align_test_classes, labels_of, parse_number};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What the passes over both splits found.
pub struct TableScan {
    pub train: Scanned,
    pub test: Option<Scanned>,
    /// The labels as the model sees them (the training split's).
    pub kind: LabelKind,
    /// The class names, for classes.
    pub classes: Option<Classes>,
    /// The one class every training row holds, when that is so (a warning's).
    pub single_class: Option<String>,
}

/// One split's files after the pass: nothing per row.
pub struct Scanned {
    pub files: Vec<PathBuf>,
    /// Objects in each file.
    pub rows: Vec<usize>,
    pub features: FeatureReader,
    pub labels: Labeler,
}

/// Passes over the training files and then the validation files, reading the validation
/// files with the training files' features, label kind and class numbering.
pub fn scan(train: &[PathBuf], validation: &[PathBuf], config: &JsonlTable) -> Result<TableScan, DataError> {
    let (train_split, train_labels) = scan_split(train, config, config.features.clone(), config.labels)?;
    let first = &train[0];
    let found = train_labels.finish(first, &config.label)?;
    let (kind, classes) = match &found.code {
        LabelCode::Numbered { classes } => (LabelKind::Class { classes: *classes }, Some(Classes::numbered(*classes))),
        LabelCode::Names(names) => {
            (LabelKind::Class { classes: names.len() as u32 }, Some(Classes::from_names(names.clone())))
        }
        LabelCode::Targets => (LabelKind::Target { width: 1 }, None),
    };
    let train_scanned = train_split.with_labels(Labeler { code: found.code, remap: None });
    let mut scanned = TableScan { train: train_scanned, test: None, kind, classes, single_class: found.single };
    if validation.is_empty() {
        return Ok(scanned);
    }
    let test_kind = match scanned.classes {
        Some(_) => CsvLabels::Classes,
        None => CsvLabels::Regression,
    };
    let names = scanned.train.features.names.clone();
    let (test_split, test_labels) = scan_split(validation, config, Some(names), Some(test_kind))?;
    // An array field must hold as many values in every file.
    test_split.features.same_widths_as(&scanned.train.features)?;
    let test_found = test_labels.finish(&validation[0], &config.label)?;
    let remap = match &scanned.classes {
        Some(classes) => Some(align(classes, &test_found, config, first, &validation[0])?),
        None => None,
    };
    scanned.test = Some(test_split.with_labels(Labeler { code: test_found.code, remap }));
    Ok(scanned)
}

/// A split's files after the pass, before its labels are made.
struct SplitPass {
    files: Vec<PathBuf>,
    rows: Vec<usize>,
    features: FeatureReader,
}

impl SplitPass {
    fn with_labels(self, labels: Labeler) -> Scanned {
        Scanned { files: self.files, rows: self.rows, features: self.features, labels }
    }
}

/// Reads every object of `paths` once, holding one at a time; `names` are the feature fields
/// (all but the label of the first object, sorted, when `None`).
fn scan_split(
    paths: &[PathBuf],
    config: &JsonlTable,
    names: Option<Vec<String>>,
    kind: Option<CsvLabels>,
) -> Result<(SplitPass, LabelPass), DataError> {
    let mut features = names.map(FeatureReader::new);
    let mut labels = LabelPass::new(kind);
    let (mut rows, mut x) = (Vec::with_capacity(paths.len()), vec![]);
    for path in paths {
        let mut lines = Lines::open(path)?;
        let mut objects = 0;
        while let Some(line) = lines.next_object()? {
            let reader = features.get_or_insert_with(|| FeatureReader::new(feature_names(&line, config)));
            x.clear();
            reader.read(path, &line, &mut x)?;
            labels.push(label_value(path, &line, &config.label)?, (path, line.line, line.byte));
            objects += 1;
        }
        rows.push(objects);
    }
    let Some(features) = features.filter(|_| labels.rows > 0) else {
        let path = paths.first().cloned().unwrap_or_default();
        return Err(DataError::Malformed {
            path,
            at: Position::File,
            problem: "no JSON objects; a JSONL table needs one object a line, each with the feature and label \
                      fields"
                .into(),
        });
    };
    Ok((SplitPass { files: paths.to_vec(), rows, features }, labels))
}

/// The label field's value as the `csv` source reads a cell: a string as it is, a number as
/// JSON writes it.
pub fn label_value(path: &Path, line: &ObjectLine, label: &str) -> Result<String, DataError> {
    match line.object.get(label) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(wrong_field(path, line, label, kind_of(other), "a string or a number")),
        None => Err(missing_field(path, line, label)),
    }
}

/// Where a row was: its file, line and byte.
type RowPlace = (PathBuf, u64, u64);

/// A label cell kept by the pass, with its place.
struct KeptLabel {
    cell: LabelCell,
    place: RowPlace,
}

/// What the pass keeps of the labels to decide them as `csv::labels_of` does over every
/// cell: the first number and the first text (inference), the first value that is no number
/// (for regression), whether all are class indices and the largest, and the distinct class
/// names (a classifier's classes; bounded by them, not by the rows).
struct LabelPass {
    kind: Option<CsvLabels>,
    /// Rows seen; a cell's `line` is its 1-based row across the split's files.
    rows: u64,
    first_number: Option<KeptLabel>,
    first_text: Option<KeptLabel>,
    first_not_number: Option<KeptLabel>,
    all_indices: bool,
    largest: u32,
    /// The first row's class index, and whether every row's is the same.
    first_index: Option<u32>,
    one_index: bool,
    names: BTreeSet<String>,
}

/// The labels decided: how each row's value becomes its label, the one class of every row
/// when that is so, and the class names seen.
struct Found {
    code: LabelCode,
    single: Option<String>,
    names: BTreeSet<String>,
}

impl LabelPass {
    fn new(kind: Option<CsvLabels>) -> Self {
        LabelPass {
            kind,
            rows: 0,
            first_number: None,
            first_text: None,
            first_not_number: None,
            all_indices: true,
            largest: 0,
            first_index: None,
            one_index: true,
            names: BTreeSet::new(),
        }
    }

    fn push(&mut self, value: String, (path, line, byte): (&Path, u64, u64)) {
        self.rows += 1;
        let row = self.rows;
        let keep = |value: &String| KeptLabel {
            cell: LabelCell { value: value.clone(), line: row },
            place: (path.to_path_buf(), line, byte),
        };
        match value.parse::<u32>() {
            Ok(i) => {
                self.largest = self.largest.max(i);
                self.one_index &= *self.first_index.get_or_insert(i) == i;
            }
            Err(_) => self.all_indices = false,
        }
        let number = parse_number(&value).is_ok();
        let first = if number { &mut self.first_number } else { &mut self.first_text };
        if first.is_none() {
            *first = Some(keep(&value));
        }
        if !number && self.first_not_number.is_none() {
            self.first_not_number = Some(keep(&value));
        }
        // Names are needed only where they can become classes: every value of a column read as
        // classes; text where the kind is inferred (numbers beside text are an error then).
        let name = match self.kind {
            Some(CsvLabels::Classes) => true,
            Some(CsvLabels::Regression) => false,
            None => !number,
        };
        if name && !self.names.contains(&value) {
            self.names.insert(value);
        }
    }

    /// The labels of every row pushed, or the error `labels_of` gives over all of them
    /// (`first` names the split's first file).
    fn finish(self, first: &Path, label: &str) -> Result<Found, DataError> {
        let kept = [&self.first_number, &self.first_text, &self.first_not_number];
        let error = |(row, problem): (u64, String)| {
            let place = kept.iter().flat_map(|k| k.iter()).find(|k| k.cell.line == row).map(|k| k.place.clone());
            let (path, line, byte) = place.unwrap_or((first.to_path_buf(), 0, 0));
            DataError::Malformed {
                path,
                at: Position::LineByte { line, column: 1, byte },
                problem: format!("label field `{label}`: {}", problem.replace(" on line ", " on row ")),
            }
        };
        // `labels_of` over the kept cells gives the error it gives over all of them: the mixed
        // kinds' names the first of each, a regression target the first that is no number.
        let cells = |kept: &[&Option<KeptLabel>]| -> Vec<LabelCell> {
            kept.iter()
                .flat_map(|k| k.iter())
                .map(|k| LabelCell { value: k.cell.value.clone(), line: k.cell.line })
                .collect()
        };
        let kind = match self.kind {
            Some(kind) => kind,
            None if self.first_number.is_some() && self.first_text.is_some() => {
                labels_of(&cells(&[&self.first_number, &self.first_text]), None).map_err(error)?;
                CsvLabels::Classes
            }
            None if self.first_text.is_none() && self.first_number.is_some() && !self.all_indices => {
                CsvLabels::Regression
            }
            None => CsvLabels::Classes,
        };
        if kind == CsvLabels::Regression {
            labels_of(&cells(&[&self.first_not_number]), Some(kind)).map_err(error)?;
        }
        let (code, single) = match kind {
            CsvLabels::Classes if self.all_indices => {
                let single = self.first_index.filter(|_| self.one_index).map(|i| i.to_string());
                (LabelCode::Numbered { classes: self.largest.saturating_add(1) }, single)
            }
            CsvLabels::Classes => {
                let names: Vec<String> = self.names.iter().cloned().collect();
                let single = (names.len() == 1).then(|| names[0].clone());
                (LabelCode::Names(names), single)
            }
            CsvLabels::Regression => (LabelCode::Targets, None),
        };
        Ok(Found { code, single, names: self.names })
    }
}

/// How a split's label values become labels.
#[derive(Debug, Clone, PartialEq)]
enum LabelCode {
    /// Whole numbers, classes `0..classes`.
    Numbered { classes: u32 },
    /// Class names, sorted: a name's class is its index.
    Names(Vec<String>),
    /// Regression targets.
    Targets,
}

/// A split's label values to labels: its own classes, renumbered as the training split's for
/// the test split.
#[derive(Debug, Clone)]
pub struct Labeler {
    code: LabelCode,
    /// The training split's class of each of this split's classes (the test split's).
    remap: Option<Vec<u32>>,
}

impl Labeler {
    /// The label of `value`; `None` for a value the pass did not see (the file changed since).
    pub fn label(&self, value: &str) -> Option<RowLabel> {
        let own = match &self.code {
            LabelCode::Numbered { .. } => value.parse::<u32>().ok()?,
            LabelCode::Names(names) => names.binary_search_by(|n| n.as_str().cmp(value)).ok()? as u32,
            LabelCode::Targets => return parse_number(value).ok().map(RowLabel::Target),
        };
        let class = match &self.remap {
            Some(remap) => *remap.get(own as usize)?,
            None => own,
        };
        Some(RowLabel::Class(class))
    }
}

/// The training split's class of each of the test split's classes, or the error naming the
/// test classes the training split lacks. `align_test_classes` decides, over one row per
/// test class, so its numbering and its error are the `csv` source's.
fn align(
    classes: &Classes,
    test: &Found,
    config: &JsonlTable,
    train_path: &Path,
    test_path: &Path,
) -> Result<Vec<u32>, DataError> {
    let (own, test_classes) = match &test.code {
        LabelCode::Numbered { classes } => {
            let used: BTreeSet<u32> = test.names.iter().filter_map(|n| n.parse().ok()).collect();
            (used.into_iter().collect::<Vec<u32>>(), Classes::numbered(*classes))
        }
        LabelCode::Names(names) => ((0..names.len() as u32).collect(), Classes::from_names(names.clone())),
        LabelCode::Targets => return Ok(vec![]),
    };
    let table = |index, classes| CsvDataset::from_parts(vec![], vec![], Labels::Classes { index, classes });
    let train = table(vec![], classes.clone());
    let mut test_table = table(own.clone(), test_classes.clone());
    align_test_classes(&train, &mut test_table, &config.label, train_path, test_path)?;
    let mut remap = vec![0; test_classes.len() as usize];
    if let Labels::Classes { index, .. } = test_table.labels() {
        for (&from, &to) in own.iter().zip(index) {
            remap[from as usize] = to;
        }
    }
    Ok(remap)
}

/// The features of `file`, given to `predict --input`, and one example's shape: the fields the
/// training table reads (`config.features`, else every field but the label of the first
/// training object, sorted), each as wide as there; the label field may be left out. The
/// features are held: predictions are written whole.
pub fn read_input(train: &[PathBuf], config: &JsonlTable, file: &Path) -> Result<(Vec<usize>, Vec<f32>), DataError> {
    let mut reference = FeatureReader::new(config.features.clone().unwrap_or_default());
    let mut first_row = vec![];
    if let Some(first) = train.first()
        && let Some(line) = Lines::open(first)?.next_object()?
    {
        if config.features.is_none() {
            reference = FeatureReader::new(feature_names(&line, config));
        }
        reference.read(first, &line, &mut first_row)?;
    }
    let mut rows = FeatureReader::new(reference.names.clone());
    let mut values = vec![];
    let mut lines = Lines::open(file)?;
    while let Some(line) = lines.next_object()? {
        rows.read(file, &line, &mut values)?;
    }
    rows.same_widths_as(&reference)?;
    Ok((vec![first_row.len()], values))
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

/// Reads an object's features: fields `names` in order, numbers or arrays of numbers
/// (flattened), each as wide in every row as in the first.
#[derive(Debug, Clone)]
pub struct FeatureReader {
    names: Vec<String>,
    /// The widths found, from the first row read.
    fields: Vec<Field>,
}

impl FeatureReader {
    fn new(names: Vec<String>) -> Self {
        FeatureReader { names, fields: vec![] }
    }

    /// Values in one row (once a row has been read).
    pub fn width(&self) -> usize {
        self.fields.iter().map(|f| f.width).sum()
    }

    /// Appends `line`'s features to `out`; the first row read sets each field's width.
    fn read(&mut self, path: &Path, line: &ObjectLine, out: &mut Vec<f32>) -> Result<(), DataError> {
        for (i, name) in self.names.iter().enumerate() {
            let width = values(path, line, name, out)?;
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

    /// Appends `line`'s features to `out`, each field as wide as the pass found it.
    pub fn decode(&self, path: &Path, line: &ObjectLine, out: &mut Vec<f32>) -> Result<(), DataError> {
        for field in &self.fields {
            let width = values(path, line, &field.name, out)?;
            if width != field.width {
                return Err(width_differs(path, line, field, width));
            }
        }
        Ok(())
    }

    /// An error when an array field holds another number of values than in `train`.
    fn same_widths_as(&self, train: &FeatureReader) -> Result<(), DataError> {
        for (mine, theirs) in self.fields.iter().zip(&train.fields) {
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
}

/// Appends the values of `line`'s field `name` to `out`; returns how many.
fn values(path: &Path, line: &ObjectLine, name: &str, out: &mut Vec<f32>) -> Result<usize, DataError> {
    let value = line.object.get(name).ok_or_else(|| missing_field(path, line, name))?;
    let before = out.len();
    match value {
        Value::Number(n) => out.push(number(path, line, name, n)?),
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::Number(n) => out.push(number(path, line, name, n)?),
                    other => {
                        let found = format!("an array holding {}", kind_of(other));
                        return Err(wrong_field(path, line, name, &found, "numbers"));
                    }
                }
            }
        }
        other => return Err(wrong_field(path, line, name, kind_of(other), "a number or an array of numbers")),
    }
    Ok(out.len() - before)
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
