//! A columnar table's columns ([`TableColumns`]): found in the files' Arrow schemas and checked
//! (a missing column names the columns there; a column of another type names its type and
//! what was expected), the label column's classes read, and each Arrow record batch turned
//! into rows of `f32` features and a label ([`TableColumns::decode`]).

use super::split::{RowLabel, TableRow};
use super::{Columnar, ColumnarFile, class_label};
use crate::data::CsvLabels;
use crate::data::error::DataError;
use crate::data::examples::LabelKind;
use crate::data::formats::Classes;
use crate::data::source::parquet::ParquetTable;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema};
use std::collections::BTreeSet;
use std::path::Path;

/// How a feature column's values make up an example's.
#[derive(Debug, Clone, PartialEq)]
enum ColumnLayout {
    /// One number a row.
    Scalar,
    /// A list of `width` numbers a row (`FixedSizeList`, or `List`/`LargeList` whose rows all
    /// hold that many).
    List,
}

/// One feature column.
#[derive(Debug, Clone, PartialEq)]
struct Feature {
    name: String,
    data_type: DataType,
    layout: ColumnLayout,
    width: usize,
}

/// What the label column holds, which decides the labels.
#[derive(Debug, Clone, PartialEq)]
enum LabelMap {
    /// Whole numbers `0..classes`; `names` when a `datasets` `ClassLabel` names them (class
    /// `i` is `names[i]`, in the dataset's order, and there are as many classes as names).
    Indices { classes: u32, names: Option<Vec<String>> },
    /// Class names, sorted: a name's index is its class.
    Names(Vec<String>),
    /// A float target.
    Target,
}

/// The feature columns and the label column of a table, as the training files hold them.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::data::source) struct TableColumns {
    format: Columnar,
    features: Vec<Feature>,
    label: String,
    label_type: DataType,
    map: LabelMap,
    shape: Vec<usize>,
    width: usize,
}

impl TableColumns {
    /// The columns `table` names, found in the first training file; the classes are read from
    /// the training files' label column.
    pub(in crate::data::source) fn resolve(
        format: Columnar,
        train: &[ColumnarFile],
        table: &ParquetTable,
    ) -> Result<Self, DataError> {
        let (first_file, section) = (&train[0], format.section());
        let (first, schema) = (first_file.path(), first_file.schema());
        let mut features = vec![];
        for name in &table.features {
            let data_type = column(format, first, schema, name)?.clone();
            let wrong = || wrong_type(format, first, name, &data_type, "numbers, booleans or lists of numbers");
            let layout = match &data_type {
                DataType::FixedSizeList(item, _) | DataType::List(item) | DataType::LargeList(item) => {
                    if !numeric(item.data_type()) {
                        return Err(wrong());
                    }
                    ColumnLayout::List
                }
                other if numeric(other) => ColumnLayout::Scalar,
                _ => return Err(wrong()),
            };
            let width = match &data_type {
                DataType::FixedSizeList(_, n) => usize::try_from(*n).unwrap_or(0),
                _ if layout == ColumnLayout::List => first_row_width(format, first_file, name)?,
                _ => 1,
            };
            features.push(Feature { name: name.clone(), data_type, layout, width });
        }
        if features.is_empty() {
            return Err(format.bad(format!("{section}.table.features lists no column; name the feature columns")));
        }
        let label_type = column(format, first, schema, &table.label)?.clone();
        let map = label_map(format, train, &table.label, &label_type, table.labels)?;
        let width = features.iter().map(|f| f.width).sum();
        let shape = table.shape.clone().unwrap_or(vec![width]);
        if shape.iter().product::<usize>() != width || shape.contains(&0) {
            return Err(format.bad(format!(
                "{section}.table.shape = {shape:?} holds {} values, but the feature columns give {width} a row",
                shape.iter().product::<usize>()
            )));
        }
        Ok(Self { format, features, label: table.label.clone(), label_type, map, shape, width })
    }

    /// Checks that `path`'s schema holds every column with the type the first file's has.
    pub(super) fn check(&self, path: &Path, schema: &Schema) -> Result<(), DataError> {
        self.check_columns(path, schema, true)
    }

    /// Checks `path`'s feature columns only: a file given to `predict --input` needs no label.
    pub(in crate::data::source) fn check_features(&self, path: &Path, schema: &Schema) -> Result<(), DataError> {
        self.check_columns(path, schema, false)
    }

    fn check_columns(&self, path: &Path, schema: &Schema, label: bool) -> Result<(), DataError> {
        let columns = self.features.iter().map(|f| (&f.name, &f.data_type));
        let label = label.then_some((&self.label, &self.label_type));
        for (name, expected) in columns.chain(label) {
            let found = column(self.format, path, schema, name)?;
            if found != expected {
                let expected = format!("{expected}, as in the first training file");
                return Err(wrong_type(self.format, path, name, found, &expected));
            }
        }
        Ok(())
    }

    /// The columns read, by name.
    pub(super) fn names(&self) -> impl Iterator<Item = &str> {
        self.feature_names().chain([self.label.as_str()])
    }

    /// The feature columns, by name.
    pub(in crate::data::source) fn feature_names(&self) -> impl Iterator<Item = &str> {
        self.features.iter().map(|f| f.name.as_str())
    }

    /// The format of the files, which words the errors.
    pub(super) fn format(&self) -> Columnar {
        self.format
    }

    /// One example's shape.
    pub(in crate::data::source) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The labels, and the class names when labels are names.
    pub(in crate::data::source) fn labels(&self) -> (LabelKind, Option<Classes>) {
        match &self.map {
            LabelMap::Indices { classes, names } => {
                (LabelKind::Class { classes: *classes }, names.clone().map(Classes::from_names))
            }
            LabelMap::Names(names) => {
                let classes = u32::try_from(names.len()).unwrap_or(u32::MAX);
                (LabelKind::Class { classes }, Some(Classes::from_names(names.clone())))
            }
            LabelMap::Target => (LabelKind::Target { width: 1 }, None),
        }
    }

    /// Appends the rows of `batch` (read from `path`) to `rows`.
    pub(super) fn decode(&self, batch: &RecordBatch, path: &Path, rows: &mut Vec<TableRow>) -> Result<(), DataError> {
        let n = batch.num_rows();
        let x = self.decode_features(batch, path)?;
        let labels = self.decode_labels(batch_column(self.format, batch, path, &self.label)?.as_ref(), path)?;
        let examples = x.chunks(self.width.max(1)).take(n).zip(labels);
        rows.extend(examples.map(|(x, label)| TableRow { x: x.to_vec(), label }));
        Ok(())
    }

    /// The features of `batch`'s rows (read from `path`), row after row.
    pub(in crate::data::source) fn decode_features(
        &self,
        batch: &RecordBatch,
        path: &Path,
    ) -> Result<Vec<f32>, DataError> {
        let n = batch.num_rows();
        let mut x = vec![0f32; n * self.width];
        let mut at = 0;
        for feature in &self.features {
            let array = batch_column(self.format, batch, path, &feature.name)?;
            let values = match feature.layout {
                ColumnLayout::Scalar => numbers(array.as_ref()),
                ColumnLayout::List => list_values(self.format, array.as_ref(), feature, path)?,
            }
            .ok_or_else(|| wrong_type(self.format, path, &feature.name, array.data_type(), "numbers"))?;
            for (r, row) in x.chunks_mut(self.width.max(1)).enumerate() {
                row[at..at + feature.width].copy_from_slice(&values[r * feature.width..(r + 1) * feature.width]);
            }
            at += feature.width;
        }
        Ok(x)
    }

    fn decode_labels(&self, array: &dyn Array, path: &Path) -> Result<Vec<RowLabel>, DataError> {
        let (name, format) = (&self.label, self.format);
        let wrong = |expected| wrong_type(format, path, name, array.data_type(), expected);
        match &self.map {
            LabelMap::Target => {
                Ok(numbers(array).ok_or_else(|| wrong("numbers"))?.into_iter().map(RowLabel::Target).collect())
            }
            LabelMap::Indices { classes, .. } => {
                let values = integers(array).ok_or_else(|| wrong("integers"))?;
                values
                    .into_iter()
                    .map(|v| match u32::try_from(v) {
                        Ok(c) if c < *classes => Ok(RowLabel::Class(c)),
                        _ => Err(format.bad(format!(
                            "{}: column `{name}` holds the class {v}, outside the training files' classes 0..{classes}",
                            path.display()
                        ))),
                    })
                    .collect()
            }
            LabelMap::Names(names) => {
                let strings = strings(array).ok_or_else(|| wrong("strings"))?;
                strings
                    .into_iter()
                    .map(|s| match names.binary_search_by(|n| n.as_str().cmp(s)) {
                        Ok(c) => Ok(RowLabel::Class(u32::try_from(c).unwrap_or(u32::MAX))),
                        Err(_) => Err(format.bad(format!(
                            "{}: column `{name}` holds the class `{s}`, which no training file holds; the classes \
                             are {}",
                            path.display(),
                            names.join(", ")
                        ))),
                    })
                    .collect()
            }
        }
    }
}

/// `name`'s type in `schema`, or the error naming the columns there.
pub(super) fn column<'s>(
    format: Columnar,
    path: &Path,
    schema: &'s Schema,
    name: &str,
) -> Result<&'s DataType, DataError> {
    match schema.field_with_name(name) {
        Ok(field) => Ok(field.data_type()),
        Err(_) => {
            let present: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Err(format.bad(format!("{} has no column `{name}`; its columns: {}", path.display(), present.join(", "))))
        }
    }
}

/// The error for column `name` of `path` holding `found` where `expected` was needed.
pub(super) fn wrong_type(format: Columnar, path: &Path, name: &str, found: &DataType, expected: &str) -> DataError {
    format.bad(format!("{}: column `{name}` is {found}; expected {expected}", path.display()))
}

/// `batch`'s column `name` (the reader's projection holds it), with no nulls.
fn batch_column(
    format: Columnar,
    batch: &RecordBatch,
    path: &Path,
    name: &str,
) -> Result<arrow_array::ArrayRef, DataError> {
    let array = batch
        .column_by_name(name)
        .ok_or_else(|| format.bad(format!("{}: column `{name}` was not read with the others", path.display())))?;
    if array.null_count() > 0 {
        return Err(format.bad(format!(
            "{}: column `{name}` has {} null values; every row needs one",
            path.display(),
            array.null_count()
        )));
    }
    Ok(array.clone())
}

fn numeric(data_type: &DataType) -> bool {
    data_type.is_integer() || matches!(data_type, DataType::Float32 | DataType::Float64 | DataType::Boolean)
}

/// A numeric column's values as `f32`; `None` for a column of another type.
fn numbers(array: &dyn Array) -> Option<Vec<f32>> {
    macro_rules! cast {
        ($t:ty) => {
            array.as_primitive::<$t>().values().iter().map(|&v| v as f32).collect()
        };
    }
    Some(match array.data_type() {
        DataType::Float32 => array.as_primitive::<Float32Type>().values().to_vec(),
        DataType::Float64 => cast!(Float64Type),
        DataType::Int8 => cast!(Int8Type),
        DataType::Int16 => cast!(Int16Type),
        DataType::Int32 => cast!(Int32Type),
        DataType::Int64 => cast!(Int64Type),
        DataType::UInt8 => cast!(UInt8Type),
        DataType::UInt16 => cast!(UInt16Type),
        DataType::UInt32 => cast!(UInt32Type),
        DataType::UInt64 => cast!(UInt64Type),
        DataType::Boolean => array.as_boolean().values().iter().map(|b| if b { 1.0 } else { 0.0 }).collect(),
        _ => return None,
    })
}

/// An integer column's values; `None` for a column of another type.
fn integers(array: &dyn Array) -> Option<Vec<i64>> {
    macro_rules! widen {
        ($t:ty) => {
            array.as_primitive::<$t>().values().iter().map(|&v| i64::from(v)).collect()
        };
    }
    Some(match array.data_type() {
        DataType::Int8 => widen!(Int8Type),
        DataType::Int16 => widen!(Int16Type),
        DataType::Int32 => widen!(Int32Type),
        DataType::Int64 => array.as_primitive::<Int64Type>().values().to_vec(),
        DataType::UInt8 => widen!(UInt8Type),
        DataType::UInt16 => widen!(UInt16Type),
        DataType::UInt32 => widen!(UInt32Type),
        DataType::UInt64 => {
            array.as_primitive::<UInt64Type>().values().iter().map(|&v| i64::try_from(v).unwrap_or(-1)).collect()
        }
        _ => return None,
    })
}

/// A string column's values; `None` for a column of another type.
pub(super) fn strings(array: &dyn Array) -> Option<Vec<&str>> {
    Some(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().iter().map(Option::unwrap_or_default).collect(),
        DataType::LargeUtf8 => array.as_string::<i64>().iter().map(Option::unwrap_or_default).collect(),
        DataType::Utf8View => array.as_string_view().iter().map(Option::unwrap_or_default).collect(),
        _ => return None,
    })
}

/// A list column's values, `feature.width` a row, row after row; a row of another length is
/// an error naming it.
fn list_values(
    format: Columnar,
    array: &dyn Array,
    feature: &Feature,
    path: &Path,
) -> Result<Option<Vec<f32>>, DataError> {
    let (values, offsets): (Option<Vec<f32>>, Vec<usize>) = match array.data_type() {
        DataType::FixedSizeList(..) => {
            let list = array.as_fixed_size_list();
            // A sliced list's values are sliced with it: row `r` starts at `r × width`.
            (numbers(list.values().as_ref()), (0..=list.len()).map(|r| r * feature.width).collect())
        }
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            (numbers(list.values().as_ref()), list.value_offsets().iter().map(|&o| o.max(0) as usize).collect())
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            (numbers(list.values().as_ref()), list.value_offsets().iter().map(|&o| o.max(0) as usize).collect())
        }
        _ => return Ok(None),
    };
    let Some(values) = values else { return Ok(None) };
    let mut out = Vec::with_capacity(array.len() * feature.width);
    for (r, pair) in offsets.windows(2).enumerate() {
        if pair[1] - pair[0] != feature.width {
            return Err(format.bad(format!(
                "{}: column `{}` has {} values in a row (row {r} of a batch), {} in the first training row; every \
                 row needs the same number",
                path.display(),
                feature.name,
                pair[1] - pair[0],
                feature.width
            )));
        }
        out.extend_from_slice(&values[pair[0]..pair[1]]);
    }
    Ok(Some(out))
}

/// Values in the first row of list column `name` of `file`.
fn first_row_width(format: Columnar, file: &ColumnarFile, name: &str) -> Result<usize, DataError> {
    let path = file.path();
    let index = file.schema().index_of(name).map_err(|e| format.unreadable(path, e))?;
    let first = file.read_all(&[index], 1).find(|b| b.as_ref().map_or(true, |b| b.num_rows() > 0));
    let batch = first.ok_or_else(|| format.bad(format!("{} has no rows", path.display())))??;
    let array = batch.column(0);
    Ok(match array.data_type() {
        DataType::List(_) => array.as_list::<i32>().value_length(0).max(0) as usize,
        DataType::LargeList(_) => array.as_list::<i64>().value_length(0).max(0) as usize,
        _ => 0,
    })
}

/// What the label column holds: told by `labels`, else by its type; classes are read from the
/// training files (only that column).
fn label_map(
    format: Columnar,
    train: &[ColumnarFile],
    name: &str,
    data_type: &DataType,
    labels: Option<CsvLabels>,
) -> Result<LabelMap, DataError> {
    let path = train[0].path();
    let wrong_type =
        |path: &Path, name: &str, found: &DataType, expected: &str| wrong_type(format, path, name, found, expected);
    let float = matches!(data_type, DataType::Float32 | DataType::Float64);
    let text = strings(&arrow_array::new_empty_array(data_type)).is_some();
    match (labels, data_type.is_integer(), float, text) {
        (Some(CsvLabels::Regression), true, _, _) | (None | Some(CsvLabels::Regression), _, true, _) => {
            Ok(LabelMap::Target)
        }
        (None | Some(CsvLabels::Classes), true, _, _) => {
            let mut max = None;
            each_label(format, train, name, |array, path| {
                let values = integers(array).ok_or_else(|| wrong_type(path, name, array.data_type(), "integers"))?;
                if let Some(&v) = values.iter().find(|&&v| v < 0) {
                    return Err(format
                        .bad(format!("{}: column `{name}` holds the class {v}; classes start at 0", path.display())));
                }
                max = max.max(values.iter().copied().max());
                Ok(())
            })?;
            let names = class_label::names(train[0].schema(), name);
            let classes = match &names {
                // A `ClassLabel` knows its classes, those no row holds too.
                Some(names) => match max {
                    Some(m) if m >= names.len() as i64 => {
                        return Err(format.bad(format!(
                            "column `{name}` holds the class {m}, but its ClassLabel names {} classes ({})",
                            names.len(),
                            names.join(", ")
                        )));
                    }
                    _ => names.len() as i64,
                },
                None => max.map_or(0, |m| m + 1),
            };
            let classes = u32::try_from(classes).map_err(|_| {
                format.bad(format!("column `{name}` holds the class {}, too many classes", classes - 1))
            })?;
            Ok(LabelMap::Indices { classes, names })
        }
        (None | Some(CsvLabels::Classes), _, _, true) => {
            let mut names = BTreeSet::new();
            each_label(format, train, name, |array, path| {
                let values = strings(array).ok_or_else(|| wrong_type(path, name, array.data_type(), "strings"))?;
                names.extend(values.into_iter().map(str::to_owned));
                Ok(())
            })?;
            Ok(LabelMap::Names(names.into_iter().collect()))
        }
        (Some(CsvLabels::Classes), _, true, _) => {
            Err(wrong_type(path, name, data_type, "integers or strings for labels = \"classes\""))
        }
        (Some(CsvLabels::Regression), _, _, true) => {
            Err(wrong_type(path, name, data_type, "numbers for labels = \"regression\""))
        }
        _ => Err(wrong_type(path, name, data_type, "integers or strings (classes) or floats (a regression target)")),
    }
}

/// Calls `each` on every record batch of column `name` of the files `train`, without nulls.
fn each_label(
    format: Columnar,
    train: &[ColumnarFile],
    name: &str,
    mut each: impl FnMut(&dyn Array, &Path) -> Result<(), DataError>,
) -> Result<(), DataError> {
    for file in train {
        let path = file.path();
        let index = column(format, path, file.schema(), name)
            .and_then(|_| file.schema().index_of(name).map_err(|e| format.unreadable(path, e)))?;
        for batch in file.read_all(&[index], 65_536) {
            let array = batch_column(format, &batch?, path, name)?;
            each(array.as_ref(), path)?;
        }
    }
    Ok(())
}
