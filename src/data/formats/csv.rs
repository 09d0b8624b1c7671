//! CSV tables: a header row, a label column chosen by name, and numeric feature columns (every
//! other column, or a listed set, in the listed order). The `csv` crate splits records (quotes,
//! escapes, CRLF); cells are trimmed of surrounding whitespace and then parsed strictly: a
//! feature cell must be a finite number, and anything else is an error at `file:line:column`
//! (the column being the 1-based field number) naming the value.
//!
//! Labels: with [`LabelKind::Classes`], whole numbers `0..n` are class indices as they are, and
//! any other values are class names, sorted, so the index of a name is its rank (the mapping is
//! [`Labels::classes`]). With [`LabelKind::Regression`], every label must be a finite number.
//! Left unset, the kind is inferred: text labels are classes, whole numbers are classes, other
//! numbers are regression; a column mixing numbers with text is refused rather than guessed,
//! since that is usually one bad cell in a regression target.
//!
//! The whole table is parsed at open into `f32` (a CSV file is larger than its values).

use super::{Classes, Dtype, Labels, RandomAccess, classes_from_names};
use crate::data::error::{DataError, Position, UnknownName};
use std::path::Path;

/// What the label column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelKind {
    Classes,
    Regression,
}

/// Which columns to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// The label column's header.
    pub label: String,
    /// Feature columns in this order; `None` reads every column but the label, in file order.
    pub features: Option<Vec<String>>,
    /// The label kind; `None` infers it from the values (see the module documentation).
    pub label_kind: Option<LabelKind>,
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
struct LabelCell {
    value: String,
    line: u64,
}

impl CsvDataset {
    /// Parses the table at `path`.
    pub fn open(path: &Path, options: &CsvOptions) -> Result<Self, DataError> {
        let csv_error = |source| DataError::Csv { path: path.to_path_buf(), source };
        let mut reader = ::csv::ReaderBuilder::new().trim(::csv::Trim::All).from_path(path).map_err(csv_error)?;
        let header: Vec<String> = reader.headers().map_err(csv_error)?.iter().map(str::to_string).collect();
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
        let mut features = vec![];
        let mut cells = vec![];
        let mut record = ::csv::StringRecord::new();
        while reader.read_record(&mut record).map_err(csv_error)? {
            let line = record.position().map_or(0, ::csv::Position::line);
            for &c in &feature_columns {
                let cell = record.get(c).unwrap_or_default();
                let at = Position::Line { line, column: c + 1 };
                features.push(parse_number(cell).map_err(|problem| DataError::Malformed {
                    path: path.to_path_buf(),
                    at,
                    problem: format!("column `{}`: {problem}", header[c]),
                })?);
            }
            cells.push(LabelCell { value: record.get(label_column).unwrap_or_default().to_string(), line });
        }
        let at = |line| Position::Line { line, column: label_column + 1 };
        let labels = labels_of(&cells, options.label_kind).map_err(|(line, problem)| DataError::Malformed {
            path: path.to_path_buf(),
            at: at(line),
            problem: format!("label column `{}`: {problem}", options.label),
        })?;
        let feature_names = feature_columns.iter().map(|&c| header[c].clone()).collect();
        Ok(Self { features, shape: [feature_columns.len()], feature_names, labels })
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
fn parse_number(cell: &str) -> Result<f32, String> {
    if cell.is_empty() {
        return Err("empty cell; every feature needs a value".into());
    }
    match cell.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(format!("{cell:?} is not a finite number")),
        Err(_) => Err(format!("{cell:?} is not a number")),
    }
}

/// The labels, or the line of the first bad cell and why.
fn labels_of(cells: &[LabelCell], kind: Option<LabelKind>) -> Result<Labels, (u64, String)> {
    let class_index = |c: &LabelCell| c.value.parse::<u32>().ok();
    let all_indices = cells.iter().all(|c| class_index(c).is_some());
    let kind = match kind {
        Some(kind) => kind,
        None => infer(cells)?,
    };
    match kind {
        LabelKind::Classes if all_indices => {
            let index: Vec<u32> = cells.iter().filter_map(class_index).collect();
            let count = index.iter().max().map_or(0, |&m| m + 1);
            Ok(Labels::Classes { index, classes: Classes::numbered(count) })
        }
        LabelKind::Classes => {
            let names: Vec<&str> = cells.iter().map(|c| c.value.as_str()).collect();
            let (index, classes) = classes_from_names(&names);
            Ok(Labels::Classes { index, classes })
        }
        LabelKind::Regression => {
            let values =
                cells.iter().map(|c| parse_number(&c.value).map_err(|p| (c.line, p))).collect::<Result<_, _>>()?;
            Ok(Labels::Targets { values, width: 1 })
        }
    }
}

/// Text or whole numbers: classes; other numbers: regression; numbers mixed with text: an
/// error at the first cell of the minority kind.
fn infer(cells: &[LabelCell]) -> Result<LabelKind, (u64, String)> {
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
        (_, Some(_)) | (None, None) => Ok(LabelKind::Classes),
        (Some(_), None) if cells.iter().all(|c| c.value.parse::<u32>().is_ok()) => Ok(LabelKind::Classes),
        (Some(_), None) => Ok(LabelKind::Regression),
    }
}

#[cfg(test)]
mod tests {
    use super::super::read_one;
    use super::*;
    use std::path::PathBuf;

    fn table(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn string_labels_become_sorted_classes() {
        let (_d, path) = table("sepal, petal ,species\n5.1,1.4,setosa\n 6.2 ,4.5,versicolor\n5.9,5.1,setosa\r\n");
        let data = CsvDataset::open(&path, &CsvOptions::label("species")).unwrap();
        assert_eq!(
            (data.len(), data.shape(), data.feature_names()),
            (3, &[2][..], &["sepal".to_string(), "petal".into()][..])
        );
        assert_eq!(read_one(&data, 1), [6.2, 4.5]);
        assert_eq!(data.labels().classes().unwrap().names(), ["setosa", "versicolor"]);
        assert_eq!((0..3).map(|i| data.labels().class(i).unwrap()).collect::<Vec<_>>(), [0, 1, 0]);
    }

    #[test]
    fn listed_features_are_read_in_the_listed_order() {
        let (_d, path) = table("a,b,c,y\n1,2,3,0\n4,5,6,2\n");
        let options = CsvOptions { features: Some(vec!["c".into(), "a".into()]), ..CsvOptions::label("y") };
        let data = CsvDataset::open(&path, &options).unwrap();
        assert_eq!(read_one(&data, 1), [6.0, 4.0]);
        // Whole-number labels are class indices as they are.
        assert_eq!(data.labels().classes().map(Classes::len), Some(3));
        assert_eq!(data.labels().class(1), Some(2));
    }

    #[test]
    fn float_labels_mean_regression_and_an_explicit_kind_wins() {
        let (_d, path) = table("x,price\n1,2.5\n2,3\n");
        let data = CsvDataset::open(&path, &CsvOptions::label("price")).unwrap();
        assert_eq!(data.labels(), &Labels::Targets { values: vec![2.5, 3.0], width: 1 });
        let (_d, path) = table("x,y\n1,2\n2,3\n");
        let options = CsvOptions { label_kind: Some(LabelKind::Regression), ..CsvOptions::label("y") };
        assert_eq!(
            CsvDataset::open(&path, &options).unwrap().labels(),
            &Labels::Targets { values: vec![2.0, 3.0], width: 1 }
        );
    }

    #[test]
    fn bad_cells_name_file_line_column_and_value() {
        let err = |text: &str, options: CsvOptions| {
            let (_d, path) = table(text);
            let e = CsvDataset::open(&path, &options).unwrap_err().to_string();
            e.replace(&path.display().to_string(), "t.csv")
        };
        assert_eq!(
            err("a,b,y\n1,2,0\n3,x4,1\n", CsvOptions::label("y")),
            "t.csv:3:2: column `b`: \"x4\" is not a number"
        );
        assert_eq!(
            err("a,y\n1,0\n,1\n", CsvOptions::label("y")),
            "t.csv:3:1: column `a`: empty cell; every feature needs a value"
        );
        assert_eq!(
            err("a,y\nnan,0\n", CsvOptions::label("y")),
            "t.csv:2:1: column `a`: \"nan\" is not a finite number"
        );
        assert_eq!(
            err("a,price\n1,2.5\n2,3.x\n", CsvOptions::label("price")),
            "t.csv:3:2: label column `price`: \"3.x\" is text but the column also holds numbers (\"2.5\" on line 2); \
             fix the cell, or set the label kind to classes to read every value as a class name"
        );
        let regression = CsvOptions { label_kind: Some(LabelKind::Regression), ..CsvOptions::label("y") };
        assert_eq!(err("a,y\n1,cat\n", regression), "t.csv:2:2: label column `y`: \"cat\" is not a number");
        assert_eq!(
            err("alpha,label\n1,0\n", CsvOptions::label("lable")),
            "t.csv:1:1: no column named `lable` (did you mean `label`?); it has: alpha, label"
        );
        let leak = CsvOptions { features: Some(vec!["a".into(), "y".into()]), ..CsvOptions::label("y") };
        assert_eq!(err("a,y\n1,0\n", leak), "t.csv:1:2: column `y` is the label; it cannot also be a feature");
        let ragged = err("a,y\n1,0\n1,2,3\n", CsvOptions::label("y"));
        assert!(
            ragged.starts_with("t.csv: CSV error: record 2 (line: 3, byte: 8): found record with 3 fields"),
            "{ragged}"
        );
    }
}
