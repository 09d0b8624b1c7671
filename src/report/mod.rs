//! `trainrun report DIR`.

use crate::run::RunError;
use std::path::Path;

/// Draws the report of `dir`.
pub fn run(dir: &Path) -> Result<(), RunError> {
    Err(RunError::Usage(format!("no report for {} yet", dir.display())))
}
