//! Tests of the `csv` source and its table reader: labels, feature columns, located errors.

use super::*;
use crate::data::formats::read_one;

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
    let options = CsvOptions { label_kind: Some(CsvLabels::Regression), ..CsvOptions::label("y") };
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
    assert_eq!(err("a,b,y\n1,2,0\n3,x4,1\n", CsvOptions::label("y")), "t.csv:3:2: column `b`: \"x4\" is not a number");
    assert_eq!(
        err("a,y\n1,0\n,1\n", CsvOptions::label("y")),
        "t.csv:3:1: column `a`: empty cell; every feature needs a value"
    );
    assert_eq!(err("a,y\nnan,0\n", CsvOptions::label("y")), "t.csv:2:1: column `a`: \"nan\" is not a finite number");
    assert_eq!(
        err("a,price\n1,2.5\n2,3.x\n", CsvOptions::label("price")),
        "t.csv:3:2: label column `price`: \"3.x\" is text but the column also holds numbers (\"2.5\" on line 2); \
         fix the cell, or set the label kind to classes to read every value as a class name"
    );
    let regression = CsvOptions { label_kind: Some(CsvLabels::Regression), ..CsvOptions::label("y") };
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

fn source(dir: &Path, config: CsvConfig) -> CsvSource {
    CsvSource { dir: dir.to_path_buf(), config }
}

fn config(test: Option<&str>) -> CsvConfig {
    CsvConfig { train: "a.csv".into(), test: test.map(String::from), label: "y".into(), features: None, labels: None }
}

#[test]
fn float_labels_are_targets_and_names_are_sorted_classes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.csv"), "x1,y,x2\n1,0.5,2\n3,1.5,4\n").unwrap();
    let data = source(dir.path(), config(None)).load().unwrap();
    assert_eq!(data.labels, LabelKind::Target { width: 1 });
    let b = data.train.read(0..2).unwrap();
    assert_eq!((b.x, b.y, b.targets), (vec![1., 2., 3., 4.], vec![], vec![0.5, 1.5]));

    std::fs::write(dir.path().join("a.csv"), "x1,y\n1,dog\n3,cat\n").unwrap();
    std::fs::write(dir.path().join("b.csv"), "x1,y\n1,cat\n3,dog\n").unwrap();
    let data = source(dir.path(), config(Some("b.csv"))).load().unwrap();
    assert_eq!(data.labels, LabelKind::Class { classes: 2 });
    assert_eq!(data.classes.as_ref().map(Classes::names), Some(&["cat".to_string(), "dog".into()][..]));
    assert_eq!(data.train.read(0..2).unwrap().y, [1, 0]);
    assert_eq!(source(dir.path(), config(Some("b.csv"))).facts().unwrap(), data.facts(1));

    std::fs::write(dir.path().join("b.csv"), "x1,y\n1,cat\n3,bird\n").unwrap();
    let err = source(dir.path(), config(Some("b.csv"))).load().unwrap_err().to_string();
    assert!(err.contains("holds `bird` that the training table"), "{err}");
    assert!(err.contains("(its classes: cat, dog)"), "{err}");
}
