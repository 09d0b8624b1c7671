//! `csv_logger`: Keras's `CSVLogger`. Appends each epoch's metrics to a CSV file in the run
//! folder; a resumed run keeps the rows of the epochs its backup had finished and writes the
//! later ones again.

use super::{Callback, CallbackError, Control, Logs, Restore};
use crate::strategy::Variables;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The open file.
struct Open {
    out: BufWriter<File>,
    /// Keras writes the header with the first row, its columns the keys of that row's logs.
    header: bool,
    /// Whether the header has `val_accuracy,val_loss` (the first row had them).
    val: bool,
}

/// The callback.
pub struct CsvLogger {
    name: String,
    path: PathBuf,
    append: bool,
    /// Opened at the first row of a fresh run, or when a resumed run restores it.
    open: Option<Open>,
}

impl CsvLogger {
    /// A log at `path`, appended to when `append`.
    pub fn new(name: String, path: PathBuf, append: bool) -> Self {
        Self { name, path, append, open: None }
    }

    fn err(&self) -> impl FnOnce(std::io::Error) -> CallbackError + '_ {
        |source| CallbackError { path: self.path.clone(), source }
    }

    /// Opens the file of a fresh run: appending to a file that has rows adds no second header.
    fn fresh(&self) -> Result<Open, CallbackError> {
        let has_rows = self.append && std::fs::metadata(&self.path).is_ok_and(|m| m.len() > 0);
        let val = has_rows
            && std::fs::read_to_string(&self.path)
                .is_ok_and(|t| t.lines().next().is_some_and(|l| l.contains("val_loss")));
        let file = OpenOptions::new()
            .create(true)
            .append(self.append)
            .write(true)
            .truncate(!self.append)
            .open(&self.path)
            .map_err(self.err())?;
        Ok(Open { out: BufWriter::new(file), header: has_rows, val })
    }
}

impl Callback for CsvLogger {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_epoch_end(&mut self, logs: &Logs, _vars: &Variables) -> Result<Control, CallbackError> {
        let mut open = match self.open.take() {
            Some(o) => o,
            None => self.fresh()?,
        };
        let written = write_row(&mut open, logs);
        self.open = Some(open);
        written.map_err(self.err())?;
        Ok(Control::Continue)
    }

    fn restore(&mut self, from: &Restore<'_>) -> Result<(), CallbackError> {
        let (header, val) = keep_rows(&self.path, from.epochs_done).map_err(self.err())?;
        let file = OpenOptions::new().create(true).append(true).open(&self.path).map_err(self.err())?;
        self.open = Some(Open { out: BufWriter::new(file), header, val });
        Ok(())
    }
}

fn write_row(open: &mut Open, logs: &Logs) -> std::io::Result<()> {
    if !open.header {
        // Keras's columns: `epoch`, then the first row's log keys, sorted.
        open.val = logs.val_loss.is_some() || logs.val_accuracy.is_some();
        let extra = if open.val { ",val_accuracy,val_loss" } else { "" };
        writeln!(open.out, "epoch,accuracy,learning_rate,loss{extra}")?;
        open.header = true;
    }
    // Keras writes `NA` for a column a later row lacks.
    let opt = |v: Option<f64>| v.map_or("NA".to_string(), |v| v.to_string());
    let mut row = format!("{},{},{},{}", logs.epoch - 1, opt(logs.accuracy), logs.learning_rate, logs.loss);
    if open.val {
        row.push_str(&format!(",{},{}", opt(logs.val_accuracy), opt(logs.val_loss)));
    }
    writeln!(open.out, "{row}")?;
    open.out.flush()
}

/// Keeps the header and the rows of the first `epochs` epochs of a CSV log (a resumed run
/// writes the later ones again). Returns whether it has a header, and whether it has
/// validation columns.
fn keep_rows(path: &Path, epochs: u64) -> std::io::Result<(bool, bool)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((false, false)),
        Err(e) => return Err(e),
    };
    let mut lines = text.lines();
    let Some(header) = lines.next() else { return Ok((false, false)) };
    let mut kept = format!("{header}\n");
    for line in lines {
        let epoch = line.split(',').next().and_then(|e| e.parse::<u64>().ok());
        if epoch.is_some_and(|e| e < epochs) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    let tmp = path.with_extension("csv.tmp");
    std::fs::write(&tmp, kept)?;
    std::fs::rename(&tmp, path)?;
    Ok((true, header.contains("val_loss")))
}
