//! The prediction file, one row per example in input order, in the format its extension names:
//! - `.csv`: a classifier's rows are `id,class[,name],probability` then `class_K,probability_K`
//!   for the next likeliest classes up to `--top-k`; a regression's `id,value` (or
//!   `id,value_0,value_1,…` for several targets);
//! - `.jsonl`: one object a line, `{"id","class"[,"name"],"probability","top_k":[{"class",
//!   "probability"},…]}` or `{"id","value"}` / `{"id","values":[…]}`;
//! - with `--input` files, `file` and `row` (the file as named and the row in it, from 0)
//!   follow `id` (the row's place among all the files' rows) in both: `id,file,row,class,…`;
//! - `.npy`: a little-endian float32 array `(examples, classes)` of every class's probability
//!   (the class is its argmax), or `(examples, targets)` of the values, as NumPy's `np.load`
//!   reads it.
//!
//! Numbers are written in their shortest form that reads back to the same f32, so equal
//! predictions give equal bytes.

use super::inputs::RowOrigins;
use crate::exit::RunError;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The output file's format, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredictionFormat {
    Csv,
    Jsonl,
    Npy,
}

impl PredictionFormat {
    /// The format `path`'s extension names; any other is an error listing the three.
    pub fn of(path: &Path) -> Result<PredictionFormat, RunError> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("csv") => Ok(PredictionFormat::Csv),
            Some("jsonl") => Ok(PredictionFormat::Jsonl),
            Some("npy") => Ok(PredictionFormat::Npy),
            other => Err(RunError::Usage(format!(
                "--output {}: {} is not a prediction format; end the name in .csv, .jsonl or .npy",
                path.display(),
                other.map_or("a name without an extension".to_string(), |e| format!("the extension .{e}"))
            ))),
        }
    }

    /// Its name, for the closing line.
    pub fn name(self) -> &'static str {
        match self {
            PredictionFormat::Csv => "csv",
            PredictionFormat::Jsonl => "jsonl",
            PredictionFormat::Npy => "npy",
        }
    }
}

/// What a row holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Predicted {
    /// A classifier's classes and probabilities.
    Classes {
        classes: usize,
        /// The classes' names, when the labels were names (`classes.json`).
        names: Option<Vec<String>>,
        /// Classes per row, likeliest first.
        top_k: usize,
        /// The model ends in logits: probabilities are their softmax.
        softmax: bool,
    },
    /// A regression's `width` values.
    Values { width: usize },
}

impl Predicted {
    /// Values per row in the model's output.
    pub fn width(&self) -> usize {
        match self {
            Predicted::Classes { classes, .. } => *classes,
            Predicted::Values { width } => *width,
        }
    }
}

/// Writes rows as batches come.
pub struct PredictionWriter {
    out: BufWriter<File>,
    path: PathBuf,
    format: PredictionFormat,
    predicted: Predicted,
    /// The files and rows of `--input`'s rows.
    origins: Option<RowOrigins>,
    rows: usize,
    /// Scratch for one row's probabilities and its classes by likelihood.
    probs: Vec<f32>,
    order: Vec<usize>,
}

impl PredictionWriter {
    /// Creates `path` and writes the header.
    pub fn create(
        path: &Path,
        format: PredictionFormat,
        predicted: Predicted,
        origins: Option<RowOrigins>,
        examples: usize,
    ) -> Result<PredictionWriter, RunError> {
        // Planning checked the model's output against the labels, so `predicted` has its width.
        let width = predicted.width();
        let file = File::create(path).map_err(|e| {
            RunError::Failure(format!("cannot create {} ({e}): is its folder there and writable?", path.display()))
        })?;
        let mut w = PredictionWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            path: path.to_path_buf(),
            format,
            predicted,
            origins,
            rows: 0,
            probs: vec![0.0; width],
            order: (0..width).collect(),
        };
        let header = w.header(examples);
        w.out.write_all(&header).map_err(|e| w.failed(e))?;
        Ok(w)
    }

    fn failed(&self, e: std::io::Error) -> RunError {
        RunError::Failure(format!("cannot write the predictions to {}: {e}", self.path.display()))
    }

    fn header(&self, examples: usize) -> Vec<u8> {
        let id = if self.origins.is_some() { "id,file,row" } else { "id" };
        match (self.format, &self.predicted) {
            (PredictionFormat::Csv, Predicted::Classes { names, top_k, .. }) => {
                let mut h = format!("{id},class");
                if names.is_some() {
                    h.push_str(",name");
                }
                h.push_str(",probability");
                for k in 2..=*top_k {
                    h.push_str(&format!(",class_{k},probability_{k}"));
                }
                h.push('\n');
                h.into_bytes()
            }
            (PredictionFormat::Csv, Predicted::Values { width: 1 }) => format!("{id},value\n").into_bytes(),
            (PredictionFormat::Csv, Predicted::Values { width }) => {
                let cols: Vec<String> = (0..*width).map(|i| format!("value_{i}")).collect();
                format!("{id},{}\n", cols.join(",")).into_bytes()
            }
            (PredictionFormat::Jsonl, _) => Vec::new(),
            (PredictionFormat::Npy, p) => npy_header(examples, p.width()),
        }
    }

    /// Writes the rows of `n` examples whose outputs are `out`, one example after the other.
    pub fn write_batch(&mut self, out: &[f32], n: usize) -> Result<(), RunError> {
        let width = self.predicted.width();
        for row in out.chunks_exact(width).take(n) {
            let line = self.row(row);
            self.out.write_all(&line).map_err(|e| self.failed(e))?;
            self.rows += 1;
        }
        Ok(())
    }

    fn row(&mut self, row: &[f32]) -> Vec<u8> {
        let id = self.id(self.rows);
        let Predicted::Classes { names, top_k, softmax, .. } = &self.predicted else {
            return match self.format {
                PredictionFormat::Npy => row.iter().flat_map(|v| v.to_le_bytes()).collect(),
                PredictionFormat::Csv => format!("{id},{}\n", join(row)).into_bytes(),
                PredictionFormat::Jsonl if row.len() == 1 => {
                    format!("{{\"id\":{id},\"value\":{}}}\n", json(row[0])).into_bytes()
                }
                PredictionFormat::Jsonl => format!("{{\"id\":{id},\"values\":[{}]}}\n", join(row)).into_bytes(),
            };
        };
        self.probs.copy_from_slice(row);
        if *softmax {
            softmax_in_place(&mut self.probs);
        }
        let probs = &self.probs;
        // Likeliest first; a tie goes to the lower class, so the order is fixed.
        self.order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let top = &self.order[..*top_k];
        let name = |c: usize| names.as_ref().and_then(|n| n.get(c));
        match self.format {
            PredictionFormat::Npy => probs.iter().flat_map(|v| v.to_le_bytes()).collect(),
            PredictionFormat::Csv => {
                let mut line = format!("{id},{}", top[0]);
                if let Some(n) = name(top[0]) {
                    line.push(',');
                    line.push_str(&csv_field(n));
                }
                line.push_str(&format!(",{}", probs[top[0]]));
                for &c in &top[1..] {
                    line.push_str(&format!(",{c},{}", probs[c]));
                }
                line.push('\n');
                line.into_bytes()
            }
            PredictionFormat::Jsonl => {
                let mut line = format!("{{\"id\":{id},\"class\":{}", top[0]);
                if let Some(n) = name(top[0]) {
                    line.push_str(&format!(",\"name\":{}", serde_json::Value::from(n.as_str())));
                }
                line.push_str(&format!(",\"probability\":{},\"top_k\":[", json(probs[top[0]])));
                let items: Vec<String> =
                    top.iter().map(|&c| format!("{{\"class\":{c},\"probability\":{}}}", json(probs[c]))).collect();
                line.push_str(&items.join(","));
                line.push_str("]}\n");
                line.into_bytes()
            }
        }
    }

    /// Row `n`'s id as the format writes it: the index, then with `--input` the file and the
    /// row in it (`3,a.csv,1` in CSV; `3,"file":"a.csv","row":1` inside a JSON object).
    fn id(&self, n: usize) -> String {
        match (self.format, &self.origins) {
            // An array has no ids: its rows are in input order.
            (PredictionFormat::Npy, _) => String::new(),
            (PredictionFormat::Csv | PredictionFormat::Jsonl, None) => n.to_string(),
            (PredictionFormat::Csv, Some(origins)) => {
                let (file, row) = origins.of(n);
                format!("{n},{},{row}", csv_field(file))
            }
            (PredictionFormat::Jsonl, Some(origins)) => {
                let (file, row) = origins.of(n);
                format!("{n},\"file\":{},\"row\":{row}", serde_json::Value::from(file))
            }
        }
    }

    /// Flushes the file to disk.
    pub fn finish(mut self) -> Result<(), RunError> {
        self.out.flush().map_err(|e| self.failed(e))?;
        let file = self.out.get_ref();
        file.sync_all().map_err(|e| self.failed(e))
    }
}

/// `v` as JSON: a number, or `null` for NaN and infinities, which JSON has no number for.
fn json(v: f32) -> String {
    if v.is_finite() { v.to_string() } else { "null".into() }
}

fn join(row: &[f32]) -> String {
    row.iter().map(f32::to_string).collect::<Vec<_>>().join(",")
}

/// A CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// The numerically stable softmax, in place: `exp(x - max) / sum`, summed in index order.
fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

/// A version 1.0 `.npy` header for a C-order little-endian float32 array `(rows, width)`,
/// padded so the data starts on a 64-byte boundary as NumPy writes it.
fn npy_header(rows: usize, width: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {width}), }}");
    let unpadded = 6 + 2 + 2 + dict.len() + 1;
    let padding = unpadded.next_multiple_of(64) - unpadded;
    let len = (dict.len() + padding + 1) as u16;
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.extend(std::iter::repeat_n(b' ', padding));
    h.push(b'\n');
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_npy_header_is_aligned_and_names_the_shape() {
        let h = npy_header(10000, 10);
        assert_eq!(h.len() % 64, 0);
        assert!(h.starts_with(b"\x93NUMPY\x01\x00"));
        let text = String::from_utf8_lossy(&h[10..]);
        assert!(text.contains("'shape': (10000, 10)"), "{text}");
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn top_k_is_likeliest_first_with_ties_to_the_lower_class() {
        let path = std::env::temp_dir().join(format!("trainrun-predict-test-{}.csv", std::process::id()));
        let predicted = Predicted::Classes { classes: 4, names: None, top_k: 3, softmax: false };
        let mut w = PredictionWriter::create(&path, PredictionFormat::Csv, predicted, None, 2).unwrap();
        w.write_batch(&[0.1, 0.4, 0.4, 0.1, 0.7, 0.1, 0.1, 0.1], 2).unwrap();
        w.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            text,
            "id,class,probability,class_2,probability_2,class_3,probability_3\n0,1,0.4,2,0.4,0,0.1\n1,0,0.7,1,0.1,2,0.1\n"
        );
    }

    #[test]
    fn logits_become_probabilities_that_sum_to_one() {
        let mut x = [1.0f32, 2.0, 3.0, 1000.0];
        softmax_in_place(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] > 0.999);
    }

    #[test]
    fn unknown_extensions_are_refused_with_the_three_formats() {
        let e = PredictionFormat::of(Path::new("out.parquet")).unwrap_err().to_string();
        assert!(e.contains(".parquet") && e.contains(".csv, .jsonl or .npy"), "{e}");
    }
}
